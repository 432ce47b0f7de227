# An EC2 instance as the agent's boot sees one, minus the GPU: Debian bookworm booted by
# systemd, with curl (IMDS), Docker's client and the AWS CLI's one call the unit makes. The
# user data runs once at boot as cloud-init's would (boot-user-data.service). Stand-ins, each
# named in docs/operating.md: `docker` drops `--gpus` (no NVIDIA runtime) and the awslogs
# driver's options (no CloudWatch Logs), and `aws ecr get-login-password` prints the local
# registry's password.
ARG DEBIAN=spotgate-boot/debian:bookworm
FROM ${DEBIAN}
RUN apt-get update \
    && apt-get install -y --no-install-recommends systemd systemd-sysv curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && systemctl mask getty.target console-getty.service systemd-logind.service \
        systemd-udevd.service systemd-firstboot.service systemd-remount-fs.service
COPY docker /usr/bin/docker
COPY aws /usr/local/bin/aws
COPY boot-user-data.service /etc/systemd/system/
RUN systemctl enable boot-user-data.service
ENV container=docker
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
