"""Scratch workspaces: per-conversation file staging, pull/push, checkpoints (I/O over core rules)."""
