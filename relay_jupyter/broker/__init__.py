"""relay_jupyter.broker"""
