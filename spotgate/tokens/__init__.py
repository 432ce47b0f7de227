"""Short-lived Ed25519 JWTs: keys, a rotating key ring, JWKS, `issue()` and `verify()`.

ARCHITECTURE.md. The gateway signs with the newest key of its ring; agents verify locally against
the gateway's JWKS (or a pinned key). The keys and the ring are in `keys`; the claims, `issue`
and `verify` (pure: the ring, the token and the clock reading it is given) in `claims`.
"""

from spotgate.tokens.claims import (
    AGENT_AUDIENCE,
    GATEWAY_SUBJECT_PREFIX,
    MAX_TOKEN_CHARS,
    BadAudience,
    BadIssuer,
    BadSignature,
    Claims,
    MalformedToken,
    TokenError,
    TokenExpired,
    TokenNotYetValid,
    UnknownKid,
    WrongAlgorithm,
    issue,
    verify,
)
from spotgate.tokens.keys import (
    KeyFormatError,
    KeyRing,
    SigningKey,
    VerifyKey,
    jwk_thumbprint,
    load_signing_keys_pem,
    signing_keys_from_settings,
)

__all__ = [
    "AGENT_AUDIENCE",
    "GATEWAY_SUBJECT_PREFIX",
    "MAX_TOKEN_CHARS",
    "BadAudience",
    "BadIssuer",
    "BadSignature",
    "Claims",
    "KeyFormatError",
    "KeyRing",
    "MalformedToken",
    "SigningKey",
    "TokenError",
    "TokenExpired",
    "TokenNotYetValid",
    "UnknownKid",
    "VerifyKey",
    "WrongAlgorithm",
    "issue",
    "jwk_thumbprint",
    "load_signing_keys_pem",
    "signing_keys_from_settings",
    "verify",
]
