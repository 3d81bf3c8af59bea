#!/usr/bin/env bash
# Make sure the real services the tests talk to are here: PostgreSQL running on 127.0.0.1:5432,
# the Prometheus and Alertmanager binaries and systemd-analyze (Debian packages). Idempotent; needs
# root for apt.
set -euo pipefail

if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then
  echo "installing prometheus and prometheus-alertmanager (Debian packages)..."
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    prometheus prometheus-alertmanager
fi

# systemd-analyze verifies the shipped systemd units (tests/integration/test_deploy_files.py).
if ! command -v systemd-analyze >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends systemd
fi

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "starting PostgreSQL..."
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432
