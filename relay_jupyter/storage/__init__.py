"""relay_jupyter.storage"""
