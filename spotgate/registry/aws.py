"""The AWS session every client of ours is built from (DynamoDB, EC2, SQS, Secrets Manager)."""

from __future__ import annotations

import functools

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


def aws_session(aws: AwsSettings) -> aioboto3.Session:
    """An aioboto3 session for the settings' region, with their credentials when set."""
    core = AioSession()
    core.register_component("data_loader", shared_loader(core.get_config_variable("data_path")))
    return aioboto3.Session(
        botocore_session=core,
        region_name=aws.region,
        aws_access_key_id=aws.access_key_id,
        aws_secret_access_key=(
            aws.secret_access_key.get_secret_value() if aws.secret_access_key else None
        ),
    )
