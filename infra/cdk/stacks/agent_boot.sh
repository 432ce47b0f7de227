#!/bin/bash
# Boot script of a spotgate GPU agent. It installs nothing: the agent's image (vLLM and
# spotgate at the versions and hashes of requirements/agent-gpu.lock, built once by
# `cdk deploy`) is pulled from ECR and run under systemd with the agent's settings, its log
# shipped to CloudWatch Logs by Docker's awslogs driver. The AMI brings Docker, the NVIDIA
# container toolkit and the AWS CLI (the Deep Learning Base AMI has all three).
# The CDK app fills in the placeholders (names between double at-signs) at deploy time.
set -euo pipefail

# Every file is written under $ROOT (empty on an instance), so the script can be run in a
# sandbox with stand-in commands.
ROOT="${SPOTGATE_BOOT_ROOT:-}"
ENV_FILE=/etc/spotgate/agent.env
UNIT=spotgate-agent.service
CONTAINER=spotgate-agent
IMAGE='@@AGENT_IMAGE@@'
REGISTRY="${IMAGE%%/*}"
REGION=@@REGION@@
AGENT_PORT=@@AGENT_PORT@@
# Where staged models are fetched and Hugging Face downloads and vLLM's caches go (the
# container's /var/cache/spotgate). A model with a warm pool keeps them on the root volume,
# which a stop keeps, so a warm start finds its weights; for the others, the instance's NVMe
# storage where it has some (the Deep Learning AMI mounts it here; a stop wipes it), else the
# root volume.
CACHE=/var/cache/spotgate
KEEP_CACHE_ON_STOP=@@KEEP_CACHE_ON_STOP@@
if [ "${KEEP_CACHE_ON_STOP}" = false ] && [ -d "${ROOT}/opt/dlami/nvme" ]; then
  CACHE=/opt/dlami/nvme/spotgate
fi

imds() {
  local token
  token=$(curl -fsS -X PUT http://169.254.169.254/latest/api/token \
    -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')
  curl -fsS -H "X-aws-ec2-metadata-token: ${token}" \
    "http://169.254.169.254/latest/meta-data/$1"
}

INSTANCE_ID=$(imds instance-id)
PRIVATE_IP=$(imds local-ipv4)
mkdir -p "${ROOT}/etc/spotgate" "${ROOT}/etc/systemd/system"

# The agent's settings. Nothing secret: tokens are checked against the gateway's public JWKS.
(
  umask 077
  cat > "${ROOT}${ENV_FILE}" <<'SETTINGS'
@@AGENT_SETTINGS@@
SETTINGS
  echo "SPOTGATE_AGENT_ADVERTISE_URL=http://${PRIVATE_IP}:${AGENT_PORT}" >> "${ROOT}${ENV_FILE}"
)

# ECR's login lasts 12 hours: every (re)start of the unit logs in again before it pulls.
cat > "${ROOT}/etc/systemd/system/${UNIT}" <<UNIT
[Unit]
Description=spotgate GPU agent (container)
Wants=network-online.target docker.service
After=network-online.target docker.service

[Service]
ExecStartPre=/bin/sh -c 'aws ecr get-login-password --region ${REGION} | docker login --username AWS --password-stdin ${REGISTRY}'
ExecStartPre=-/usr/bin/docker rm --force ${CONTAINER}
# The image runs as uid 10001; the cache is its to write. Made on every start: a stop wipes
# instance storage, and an instance that booted before its model kept a warm pool may be
# stopped into one.
ExecStartPre=/usr/bin/install -d -o 10001 ${CACHE}
ExecStartPre=/usr/bin/docker pull ${IMAGE}
ExecStart=/usr/bin/docker run --rm --init --name ${CONTAINER} --gpus all --network host --ipc host --ulimit nofile=65536:65536 --env-file ${ENV_FILE} --volume ${CACHE}:/var/cache/spotgate --log-driver awslogs --log-opt awslogs-region=${REGION} --log-opt awslogs-group=@@LOG_GROUP@@ --log-opt awslogs-stream=${INSTANCE_ID}/agent ${IMAGE}
# SIGTERM starts the agent's drain: Docker waits that long before SIGKILL, systemd longer.
# An agent that left by itself (drained, gone) took its container with it: no failure.
ExecStop=-/usr/bin/docker stop --time @@DRAIN_STOP_SECONDS@@ ${CONTAINER}
TimeoutStartSec=1800
TimeoutStopSec=@@STOP_TIMEOUT_SECONDS@@
Restart=on-failure
RestartSec=10

[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
# Not waited for: the pull takes minutes, and boot (cloud-init) need not hold for it.
systemctl enable --now --no-block "${UNIT}"
