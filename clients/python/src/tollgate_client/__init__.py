"""Client of the Tollgate rate-limit and quota server.

::

    from tollgate_client import Client

    with Client() as tollgate:  # TOLLGATE_SERVER, else http://127.0.0.1:7070
        with tollgate.acquire("vendor-x", wait=5) as permit:
            call_the_vendor()

:class:`Client` blocks; :class:`AsyncClient` is its asyncio twin. Every failure the server
answers with is a :class:`TollgateError` subclass carrying ``code``, ``message`` and
``field``. :mod:`tollgate_client.httpx` has httpx transports that take a vendor's quota
before each request and pause the whole fleet when the vendor says "retry after".
"""

from ._async import AcquireCall, AsyncClient, AsyncLimitsAdmin, AsyncPermit
from ._core import DEFAULT_TIMEOUT, DEFAULT_URL
from ._dispatch import PRIORITY_EXTENSION, Verdict, default_verdict, parse_retry_after
from ._errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    RateLimited,
    ServerError,
    ServerUnreachable,
    StoreUnavailable,
    TollgateError,
    TooManyKeys,
    Unauthorized,
)
from ._models import (
    Charged,
    CheckResult,
    Committed,
    Costs,
    Learned,
    LearnResult,
    LimitList,
    Limits,
    LimitStatus,
    Quota,
    Used,
)
from ._sync import Client, LimitsAdmin, Permit
from ._vendor import Advice, AdvisedQuota, read_advice

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "PRIORITY_EXTENSION",
    "AcquireCall",
    "Advice",
    "AdvisedQuota",
    "AsyncClient",
    "AsyncLimitsAdmin",
    "AsyncPermit",
    "BadRequest",
    "Charged",
    "CheckResult",
    "Client",
    "Committed",
    "Conflict",
    "Costs",
    "Forbidden",
    "LearnResult",
    "Learned",
    "LimitList",
    "LimitStatus",
    "Limits",
    "LimitsAdmin",
    "NotFound",
    "Permit",
    "Quota",
    "RateLimited",
    "ServerError",
    "ServerUnreachable",
    "StoreUnavailable",
    "TollgateError",
    "TooManyKeys",
    "Unauthorized",
    "Used",
    "Verdict",
    "__version__",
    "default_verdict",
    "parse_retry_after",
    "read_advice",
]
