#!/usr/bin/env bash
# CI hook (run by scripts/test.sh): the remote/fleet tests start their own throwaway sshd on
# 127.0.0.1, so they need the OpenSSH server and client binaries. Idempotent and quiet: apt's
# output goes to a log that is shown only if the install fails.
set -euo pipefail
if [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
log=$(mktemp)
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends openssh-server openssh-client; } >"$log" 2>&1; then
  echo "setup_sshd: apt-get failed:" >&2
  tail -20 "$log" >&2
  exit 1
fi
rm -f "$log"
# sshd refuses to start without its privilege-separation directory (the tests start sshd -D
# themselves on a free port; the package's own service is not used).
$SUDO mkdir -p /run/sshd
echo "setup_sshd: $(/usr/sbin/sshd -V 2>&1 | head -1 || true)"
