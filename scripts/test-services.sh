#!/usr/bin/env bash
# Make sure the real services the tests talk to are here: PostgreSQL running on 127.0.0.1:5432,
# the Prometheus and Alertmanager binaries, systemd-analyze, Chromium, and Slurm with munged running
# (Debian packages). Idempotent; needs root for apt. No systemd runs in CI: daemons are started directly.
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

# Slurm 22.05 (bookworm's slurm-wlm) runs the shipped prolog/epilog in
# tests/integration/test_slurm_real.py; the test starts its own slurmctld and slurmd on free ports,
# munged (their authentication) is shared and started here.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  echo "installing slurmctld, slurmd, slurm-client and munge (Debian packages)..."
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    slurmctld slurmd slurm-client munge
fi
# slurmdbd over MariaDB keeps the jobs sacct reads: tests/integration/test_slurm_admin_comment.py
# starts its own mariadbd and slurmdbd (no system service is used) to check the epilog's
# AdminComment.
if ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null \
    || ! command -v mariadb-install-db >/dev/null; then
  echo "installing slurmdbd and mariadb-server (Debian packages)..."
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    slurmdbd mariadb-server
fi
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  echo "starting munged..."
  [ -s /etc/munge/munge.key ] || {
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  }
  install -d -o munge -g munge -m 755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
fi
munge -n | unmunge >/dev/null

# Debian's Chromium drives the console's browser test (tests/integration/test_console_browser.py)
# through Playwright from PyPI; no browser is downloaded. Fonts so screenshots show text.
if ! command -v chromium >/dev/null || [ "$(fc-list 2>/dev/null | grep -ci dejavu)" = 0 ]; then
  echo "installing chromium and fonts (Debian packages)..."
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    chromium fonts-dejavu-core fonts-liberation fontconfig
fi

# Node and the JavaScript Standard Webhooks library verify the webhook body
# (tests/integration/test_webhook_envelope.py); npm ci installs what tests/js/package-lock.json pins.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "installing nodejs and npm (Debian packages)..."
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm
fi
# oidc-provider is the OpenID provider the console's sign-in tests run on loopback
# (tests/js/oidc_provider.mjs, tests/oidc_support.py).
JS_DIR="$(dirname "$0")/../tests/js"
[ -d "$JS_DIR/node_modules/standardwebhooks" ] && [ -d "$JS_DIR/node_modules/oidc-provider" ] ||
  npm ci --no-audit --no-fund --prefix "$JS_DIR"

if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  echo "starting PostgreSQL..."
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432
