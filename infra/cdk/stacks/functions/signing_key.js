// CloudFormation custom resource: put a fresh Ed25519 private key (PKCS#8 PEM) in the
// gateway's signing-key secret, unless the secret already holds one. Rotation appends keys by
// hand (the gateway signs with the last and verifies with all), so a deploy never replaces one.
const { generateKeyPairSync } = require("node:crypto");
const {
  SecretsManagerClient,
  GetSecretValueCommand,
  PutSecretValueCommand,
} = require("@aws-sdk/client-secrets-manager");

const PEM_MARKER = "-----BEGIN PRIVATE KEY-----";

async function ensureKey(secretId, client) {
  const current = await client.send(new GetSecretValueCommand({ SecretId: secretId }));
  if ((current.SecretString || "").includes(PEM_MARKER)) {
    return false;
  }
  const { privateKey } = generateKeyPairSync("ed25519");
  const pem = privateKey.export({ type: "pkcs8", format: "pem" });
  await client.send(new PutSecretValueCommand({ SecretId: secretId, SecretString: pem }));
  return true;
}

async function respond(event, status, reason) {
  const body = JSON.stringify({
    Status: status,
    Reason: reason,
    PhysicalResourceId: event.PhysicalResourceId || `${event.LogicalResourceId}-signing-key`,
    StackId: event.StackId,
    RequestId: event.RequestId,
    LogicalResourceId: event.LogicalResourceId,
  });
  // The response URL is a presigned S3 URL: it must be sent without a content type.
  await fetch(event.ResponseURL, { method: "PUT", body, headers: { "content-type": "" } });
}

exports.ensureKey = ensureKey;
exports.handler = async (event) => {
  let status = "SUCCESS";
  let reason = "signing key present";
  try {
    if (event.RequestType !== "Delete") {
      const created = await ensureKey(event.ResourceProperties.SecretId, new SecretsManagerClient({}));
      reason = created ? "signing key created" : "signing key kept";
    }
  } catch (err) {
    status = "FAILED";
    reason = `signing key: ${err.name || "Error"}: ${err.message || err}`.slice(0, 500);
  }
  await respond(event, status, reason);
};
