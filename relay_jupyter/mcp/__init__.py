"""relay_jupyter.mcp"""
