"""relay_jupyter.protocol"""
