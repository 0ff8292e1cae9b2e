"""relay_jupyter.backends"""
