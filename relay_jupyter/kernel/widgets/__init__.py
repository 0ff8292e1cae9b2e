"""ipywidgets for relay: consent and connect cards, grants table, budget meters, diff and run views.

Every widget is displayed with a ``text/plain`` fallback (see :func:`base.show`), so a saved
notebook, nbconvert or a terminal still says what happened. ipywidgets is imported only when a
widget is built, never at ``%load_ext`` time.
"""
