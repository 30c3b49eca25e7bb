"""The bottom layer: argument validation, errors, parameter transforms, atomic file IO.

Imports nothing else of gpchol. Modules: :mod:`~gpchol._base.validate`,
:mod:`~gpchol._base.errors`, :mod:`~gpchol._base.transforms`, :mod:`~gpchol._base.io`.
"""
