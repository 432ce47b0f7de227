"""The AWS session every client of ours is built from (DynamoDB, EC2, SQS, Secrets Manager)."""

from __future__ import annotations

import aioboto3

from spotgate.settings import AwsSettings


def aws_session(aws: AwsSettings) -> aioboto3.Session:
    """An aioboto3 session for the settings' region, with their credentials when set."""
    return aioboto3.Session(
        region_name=aws.region,
        aws_access_key_id=aws.access_key_id,
        aws_secret_access_key=(
            aws.secret_access_key.get_secret_value() if aws.secret_access_key else None
        ),
    )
