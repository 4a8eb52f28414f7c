"""Triton's model-repository extension (index, load, unload) over the version manager: a load or an unload runs
the swap protocol, so that requests in flight are never failed. Protocol-neutral; ``rest`` and ``grpc_api`` translate.
"""

from services.gateway.repository_api.api import RepositoryApi
from services.gateway.repository_api.auth import ACTOR, RepositoryAuth
from services.gateway.repository_api.index import IndexEntry

__all__ = ["ACTOR", "IndexEntry", "RepositoryApi", "RepositoryAuth"]
