"""relay_jupyter.testing"""
