"""relay_jupyter.kernel"""
