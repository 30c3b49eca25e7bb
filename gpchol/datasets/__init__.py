"""Real data sets shipped inside gpchol, loaded with NumPy only.

>>> from gpchol import datasets
>>> co2 = datasets.load("co2", monthly=True)
>>> co2.X.shape, co2.y.shape
((521, 1), (521,))
"""

from gpchol.datasets._load import DATASETS, Dataset, load

__all__ = ["DATASETS", "Dataset", "load"]
