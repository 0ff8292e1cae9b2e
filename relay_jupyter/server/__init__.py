"""relay_jupyter.server"""
