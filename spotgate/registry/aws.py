"""The AWS session every client of ours is built from (DynamoDB, EC2, SQS, Secrets Manager)."""

from __future__ import annotations

import functools
from typing import Any

import aioboto3
from aiobotocore.session import AioSession
from botocore.loaders import Loader, create_loader

from spotgate.settings import AwsSettings


@functools.cache
def shared_loader(data_path: str | None) -> Loader:
    """The process's one reader of botocore's data files for `data_path` (AWS_DATA_PATH).

    A loader caches what it parsed, but each session makes its own: every session would read
    and parse the endpoints and the service's model again (a tenth of a second of CPU for
    DynamoDB, more for EC2), and a process opens one for each registry, store or queue client.
    """
    return create_loader(data_path)


class _Session(aioboto3.Session):  # type: ignore[misc]  # aioboto3 is untyped
    """aioboto3's session, whose clients of a plain-HTTP endpoint build no TLS context.

    A client builds one (the CA bundle parsed anew: 20-40 ms of CPU) on its first request
    unless told not to verify; an `http://` endpoint (the local emulator) never uses it, and
    a local stack, its tools and its tests open clients by the thousand.
    """

    def client(self, service_name: str, **kwargs: Any) -> Any:
        """A client as aioboto3 makes it; `verify=False` where the endpoint is plain HTTP."""
        if str(kwargs.get("endpoint_url") or "").startswith("http://"):
            kwargs.setdefault("verify", False)
        return super().client(service_name, **kwargs)


def aws_session(aws: AwsSettings) -> aioboto3.Session:
    """An aioboto3 session for the settings' region, with their credentials when set."""
    core = AioSession()
    core.register_component("data_loader", shared_loader(core.get_config_variable("data_path")))
    return _Session(
        botocore_session=core,
        region_name=aws.region,
        aws_access_key_id=aws.access_key_id,
        aws_secret_access_key=(
            aws.secret_access_key.get_secret_value() if aws.secret_access_key else None
        ),
    )
