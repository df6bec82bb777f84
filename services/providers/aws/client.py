"""The EC2 client (aiobotocore), one per provider entry, and the translation of its exceptions
into the taxonomy.

Credentials come from the AWS default chain (environment, shared config and credentials files,
the ``profile`` option, SSO, container and instance roles), looked up by the first call, not at
start-up: the lookup may ask the instance metadata service, and constructors do no I/O. They
never reach an event, a log line or an exception text: botocore's own debug logging prints
request headers and bodies (a session token, the user data with a proxy's lease key), so its
loggers are held at INFO while a client exists.

Every client-side retry is off (``total_max_attempts: 1``): the executor owns retrying, with
the backoff the error class calls for, and a throttling answer's ``Retry-After`` reaches it as
``retry_after``. Each call is bounded by ``timeoutSeconds`` as a whole, credential lookup
included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog

# aiobotocore and botocore ship no type information: their names are Any here, and nowhere else.
from aiobotocore.session import AioSession  # type: ignore[import-untyped]
from botocore import exceptions as boto  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.parsers import ResponseParserError  # type: ignore[import-untyped]

from services.providers.aws.config import AwsConfig
from services.providers.aws.pure.classify import classify, retry_after
from services.providers.base import Permanent, ProviderError, Transient

log = structlog.get_logger("egress.provider.aws")

QUIET_LOGGERS = ("botocore", "aiobotocore")
CREDENTIALS_HOW = (
    "give AWS credentials the standard way: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in "
    "the environment, a profile in ~/.aws/credentials (the entry's `profile` option or "
    "AWS_PROFILE), SSO (`aws sso login`), or an instance or task role"
)


class ErrorAnswer:
    """What an EC2 error answer said, read once from botocore's ``ClientError``."""

    def __init__(self, exc: Any) -> None:
        response = exc.response if isinstance(exc.response, dict) else {}
        error = response.get("Error") or {}
        meta = response.get("ResponseMetadata") or {}
        headers = meta.get("HTTPHeaders") or {}
        self.code = str(error.get("Code") or "")
        self.message = str(error.get("Message") or "").strip()
        status = meta.get("HTTPStatusCode")
        self.status: int | None = status if isinstance(status, int) else None
        self.retry_after = retry_after(str(headers.get("retry-after", "")), datetime.now(UTC))


def translate(exc: BaseException, *, op: str, what: str) -> ProviderError | None:
    """``exc`` as a taxonomy error saying what failed, or None for an exception that is not the
    client's (a bug, which the instrumentation layer reports as such)."""
    if isinstance(exc, boto.ClientError):
        answer = ErrorAnswer(exc)
        cls = classify(answer.code, answer.status, op=op)
        status = f" (HTTP {answer.status})" if answer.status else ""
        return cls(
            f"{what}: {answer.code or 'error'}{status}: {answer.message or 'no message'}",
            retry_after=answer.retry_after,
        )
    if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
        return Permanent(f"{what}: no usable AWS credentials ({exc}); {CREDENTIALS_HOW}")
    if isinstance(exc, boto.ProfileNotFound):
        return Permanent(
            f"{what}: {exc}; name a profile of ~/.aws/config in `profile`, or leave it out"
        )
    if isinstance(exc, boto.ParamValidationError):
        return Permanent(f"{what}: EC2 would refuse the request: {exc}")
    if isinstance(
        exc,
        boto.HTTPClientError
        | boto.ConnectionError
        | boto.CredentialRetrievalError
        | boto.ResponseStreamingError
        | boto.IncompleteReadError,
    ):
        return Transient(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, ResponseParserError):
        # Not EC2's XML: a wrong endpointUrl, a proxy's page, a truncated answer.
        return Transient(f"{what}: the answer is not EC2's: {_first_line(exc)}")
    if isinstance(exc, boto.BotoCoreError):
        return Permanent(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, TimeoutError):
        return Transient(f"{what}: timed out")
    if isinstance(exc, OSError):
        return Transient(f"{what}: {type(exc).__name__}: {exc}")
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def error_code(exc: BaseException) -> str:
    """The EC2 error code of a ``ClientError`` (``""`` for anything else)."""
    return ErrorAnswer(exc).code if isinstance(exc, boto.ClientError) else ""


def _quiet_botocore() -> None:
    """Hold botocore's loggers at INFO at least (the module docstring says why)."""
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.INFO:
            logger.setLevel(logging.INFO)


class Ec2:
    """The EC2 client of one provider entry, made by the first call."""

    def __init__(self, provider_name: str, config: AwsConfig) -> None:
        self.provider_name = provider_name
        self.config = config
        self._client: Any = None
        self._session: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    def in_region(self, region: str) -> Ec2:
        """A client of the same entry for another region, sharing this one's session: its
        loaded service model and credentials, not read again per region."""
        config = msgspec.structs.replace(self.config, region=region, zones=(), subnets=())
        other = Ec2(self.provider_name, config)
        other._session = self._made_session()
        return other

    def _made_session(self) -> Any:
        if self._session is None:
            self._session = AioSession(profile=self.config.profile or None)
        return self._session

    async def call(self, op: str, what: str, method: str, **params: Any) -> dict[str, Any]:
        """One EC2 action (``method`` is its snake_case name), translated errors."""
        try:
            async with asyncio.timeout(self.config.timeout_seconds):
                client = await self._ensure()
                answer: dict[str, Any] = await getattr(client, method)(**params)
                return answer
        except ProviderError:
            raise
        except Exception as exc:
            translated = translate(exc, op=op, what=what)
            if translated is None:
                raise
            raise translated from exc

    async def pages(self, op: str, what: str, method: str, **params: Any) -> list[dict[str, Any]]:
        """Every page of a paginated action, following ``NextToken``; a failed page fails the
        whole listing (never a partial one)."""
        found: list[dict[str, Any]] = []
        token = ""
        for _ in range(10_000):  # a token that never ends is an endpoint bug, not a listing
            page = await self.call(
                op, what, method, **params, **({"NextToken": token} if token else {})
            )
            found.append(page)
            token = str(page.get("NextToken") or "")
            if not token:
                return found
        raise Transient(f"{what}: the listing did not end after {len(found)} pages")

    async def close(self) -> None:
        async with self._lock:
            stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def _ensure(self) -> Any:
        async with self._lock:
            if self._client is None:
                _quiet_botocore()
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(
                    self._made_session().create_client(
                        "ec2",
                        region_name=self.config.region,
                        endpoint_url=self.config.endpoint_url or None,
                        config=Config(
                            retries={"total_max_attempts": 1, "mode": "standard"},
                            connect_timeout=self.config.timeout_seconds,
                            read_timeout=self.config.timeout_seconds,
                            user_agent_extra="egress-proxies",
                        ),
                    )
                )
                self._stack = stack
                log.debug("ec2 client made", provider=self.provider_name)
            return self._client
