"""relay_jupyter.runtime"""
