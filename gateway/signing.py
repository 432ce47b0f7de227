"""Where the gateway's signing keys come from: a PEM file, PEM text, or Secrets Manager.

With none configured a key is generated at start, in local mode only (the AWS emulator):
tokens then do not survive a restart and replicas would refuse each other's tokens, so a
gateway on real AWS without a key refuses to start.
"""

from __future__ import annotations

import json

from spotgate.logging import get_logger
from spotgate.registry import aws_session
from spotgate.settings import GatewaySettings
from spotgate.tokens import KeyRing, SigningKey, load_signing_keys_pem, signing_keys_from_settings

log = get_logger(__name__)


async def load_key_ring(settings: GatewaySettings) -> KeyRing:
    """The gateway's key ring; the last key in the source signs."""
    token = settings.token
    keys = signing_keys_from_settings(token)
    if keys is None and token.signing_key_secret_id is not None:
        keys = load_signing_keys_pem(await _read_secret(settings, token.signing_key_secret_id))
    if keys is None:
        if settings.shared.aws.endpoint_url is None:
            raise SigningKeyMissing(
                "no token signing key: set SPOTGATE_GATEWAY_TOKEN__SIGNING_KEY_SECRET_ID (or "
                "…_SIGNING_KEY_FILE, …_SIGNING_KEY_PEM); a key made for this process alone "
                "would make replicas refuse each other's tokens and every restart revoke them"
            )
        log.warning("no signing key configured; generated one for this process (local mode)")
        keys = [SigningKey.generate()]
    return KeyRing(keys)


class SigningKeyMissing(Exception):
    """A gateway on real AWS has no signing key configured."""


async def _read_secret(settings: GatewaySettings, secret_id: str) -> str:
    aws = settings.shared.aws
    async with aws_session(aws).client("secretsmanager", endpoint_url=aws.endpoint_url) as client:
        response = await client.get_secret_value(SecretId=secret_id)
    return str(response["SecretString"])


async def publish_jwks(settings: GatewaySettings, ring: KeyRing) -> None:
    """Put the public keys in the SSM parameter agents read them from, if one is configured.

    Agents read it with their IAM role, not through the internet, where a key could be added
    on the way; every replica writes the same keys, and a rotation's restart writes the new.
    """
    name = settings.jwks_parameter
    if name is None:
        return
    aws, jwks = settings.shared.aws, ring.jwks()
    async with aws_session(aws).client("ssm", endpoint_url=aws.endpoint_url) as ssm:
        await ssm.put_parameter(Name=name, Value=json.dumps(jwks), Type="String", Overwrite=True)
    log.info("jwks published", parameter=name, keys=len(jwks["keys"]))
