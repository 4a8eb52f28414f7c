"""The exporter's model zoo: small real architectures built in code with fixed seeds, exported in both formats
by ``make zoo`` (``python -m examples.zoo``) and served in ``tests/integration/test_zoo_serving.py``."""

from examples.zoo.catalog import FORMATS, ZOO, ZooModel
from examples.zoo.run import ZooRow, export_zoo, problems

__all__ = ["FORMATS", "ZOO", "ZooModel", "ZooRow", "export_zoo", "problems"]
