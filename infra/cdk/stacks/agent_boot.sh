#!/bin/bash
# Boot script of a spotgate GPU agent: installs spotgate with the `gpu` extra, writes the
# agent's settings to an environment file and runs `spotgate agent` under systemd.
# Every download is pinned: Python packages to the hashes of requirements/*.lock, the
# CloudWatch agent to a version and its SHA-256, so a replacement runs what was deployed.
# The CDK app fills in the placeholders (names between double at-signs) at deploy time.
set -euo pipefail

# Every file is written under $ROOT (empty on an instance), so the script can be run in a
# sandbox with stand-in commands.
ROOT="${SPOTGATE_BOOT_ROOT:-}"
PREFIX=/opt/spotgate
ENV_FILE=/etc/spotgate/agent.env
UNIT=spotgate-agent.service
LOG_DIR=/var/log/spotgate
AGENT_PORT=@@AGENT_PORT@@
export DEBIAN_FRONTEND=noninteractive

imds() {
  local token
  token=$(curl -fsS -X PUT http://169.254.169.254/latest/api/token \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')
  curl -fsS -H "X-aws-ec2-metadata-token: ${token}" \
    "http://169.254.169.254/latest/meta-data/$1"
}

# The boot output and the agent's log go to CloudWatch Logs first, so a failed boot can be
# read without a shell on the instance. Best effort: the agent runs without it.
ship_logs() {
  local deb=/tmp/amazon-cloudwatch-agent.deb
  local config="${ROOT}/opt/aws/amazon-cloudwatch-agent/etc/spotgate.json"
  mkdir -p "$(dirname "${config}")" || return 1
  cat > "${config}" <<'JSON' || return 1
{"logs": {"logs_collected": {"files": {"collect_list": [
  {"file_path": "/var/log/spotgate/agent.log", "log_group_name": "@@LOG_GROUP@@",
   "log_stream_name": "{instance_id}/agent"},
  {"file_path": "/var/log/cloud-init-output.log", "log_group_name": "@@LOG_GROUP@@",
   "log_stream_name": "{instance_id}/boot"}
]}}}}
JSON
  curl -fsSL -o "${deb}" \
    "https://amazoncloudwatch-agent.s3.amazonaws.com/ubuntu/amd64/@@CLOUDWATCH_AGENT_VERSION@@/amazon-cloudwatch-agent.deb" \
    && echo "@@CLOUDWATCH_AGENT_SHA256@@  ${deb}" | sha256sum -c --quiet - \
    && dpkg -i -E "${deb}" \
    && /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl \
      -a fetch-config -m ec2 -s -c "file:${config}"
}
ship_logs || echo "spotgate boot: log shipping unavailable, continuing" >&2

# spotgate needs Python 3.11 or newer: the Deep Learning Base AMI (Ubuntu 24.04) has 3.12.
apt-get -o DPkg::Lock::Timeout=600 update -q
# Triton (under vLLM) compiles a small C helper at start: it needs the Python headers.
apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv python3-dev
id spotgate >/dev/null 2>&1 \
  || useradd --system --create-home --home-dir "${PREFIX}/home" --shell /usr/sbin/nologin spotgate
mkdir -p "${ROOT}${PREFIX}/home" "${ROOT}${LOG_DIR}" "${ROOT}/etc/spotgate" \
  "${ROOT}/etc/systemd/system"
python3 -m venv "${ROOT}${PREFIX}/venv"
# boto3 fetches the source, which carries the lock of everything else.
cat > "${ROOT}${PREFIX}/boot.lock" <<'LOCK'
@@BOOT_LOCK@@
LOCK
"${ROOT}${PREFIX}/venv/bin/pip" install --quiet --require-hashes -r "${ROOT}${PREFIX}/boot.lock"
"${ROOT}${PREFIX}/venv/bin/python" - "${ROOT}${PREFIX}" <<'PY'
import sys
import zipfile

import boto3

prefix = sys.argv[1]
boto3.client("s3", region_name="@@REGION@@").download_file(
    "@@SOURCE_BUCKET@@", "@@SOURCE_KEY@@", f"{prefix}/source.zip"
)
zipfile.ZipFile(f"{prefix}/source.zip").extractall(f"{prefix}/src")
PY
"${ROOT}${PREFIX}/venv/bin/pip" install --quiet --require-hashes \
  -r "${ROOT}${PREFIX}/src/requirements/agent-gpu.lock"
# spotgate itself, with no dependency left to resolve (its build backend is in the lock).
"${ROOT}${PREFIX}/venv/bin/pip" install --quiet --no-deps --no-build-isolation \
  "${ROOT}${PREFIX}/src[gpu]"
chown -R spotgate: "${ROOT}${PREFIX}/home" "${ROOT}${LOG_DIR}"

# The agent's settings. Nothing secret: tokens are checked against the gateway's public JWKS.
PRIVATE_IP=$(imds local-ipv4)
(
  umask 077
  cat > "${ROOT}${ENV_FILE}" <<'SETTINGS'
@@AGENT_SETTINGS@@
SETTINGS
  echo "SPOTGATE_AGENT_ADVERTISE_URL=http://${PRIVATE_IP}:${AGENT_PORT}" >> "${ROOT}${ENV_FILE}"
)

cat > "${ROOT}/etc/systemd/system/${UNIT}" <<UNIT
[Unit]
Description=spotgate GPU agent
Wants=network-online.target
After=network-online.target

[Service]
User=spotgate
EnvironmentFile=${ENV_FILE}
Environment=HOME=${PREFIX}/home HF_HOME=${PREFIX}/home/huggingface
ExecStart=${PREFIX}/venv/bin/spotgate agent
Restart=on-failure
RestartSec=10
# SIGTERM starts the agent's drain; systemd must wait longer than the drain before SIGKILL.
KillSignal=SIGTERM
TimeoutStopSec=@@STOP_TIMEOUT_SECONDS@@
StandardOutput=append:${LOG_DIR}/agent.log
StandardError=append:${LOG_DIR}/agent.log
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
systemctl enable --now "${UNIT}"
