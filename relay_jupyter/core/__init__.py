"""Pure domain of relay-jupyter: types, errors, the gate, grants, budgets, classification,
workspace rules and diffs. Imports the standard library and pydantic only."""
