# What stands in for python:3.*-slim where no registry can be reached: Debian bookworm (a
# `debootstrap` root file system, imported) with its Python 3.11 in a virtualenv on PATH, where
# the slim images have theirs. agent.Dockerfile's CPU variant is built on it. It trusts the
# certificate authorities of the machine that builds it (ca-certificates.crt, in the context),
# as pip on that machine does: a network may reach PyPI only through its own TLS proxy.
ARG DEBIAN=spotgate-boot/debian:bookworm
FROM ${DEBIAN}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/python
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PATH=/opt/python/bin:$PATH \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
