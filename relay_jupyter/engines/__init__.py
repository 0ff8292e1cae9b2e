"""Run engines beyond the built-in loop (``runtime/engine.py``): ``registry.py`` lists them."""
