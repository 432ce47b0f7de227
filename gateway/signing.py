"""Where the gateway's signing keys come from: a PEM file, PEM text, or Secrets Manager.

With none configured (local mode) a key is generated at start; tokens then do not survive a
restart and several gateway replicas would not share keys, so production sets one.
"""

from __future__ import annotations

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
        log.warning("no signing key configured; generated one for this process only")
        keys = [SigningKey.generate()]
    return KeyRing(keys)


async def _read_secret(settings: GatewaySettings, secret_id: str) -> str:
    aws = settings.shared.aws
    async with aws_session(aws).client("secretsmanager", endpoint_url=aws.endpoint_url) as client:
        response = await client.get_secret_value(SecretId=secret_id)
    return str(response["SecretString"])
