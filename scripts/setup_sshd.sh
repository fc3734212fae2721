#!/usr/bin/env bash
# CI hook (run by scripts/test.sh): the remote/fleet tests start their own throwaway sshd on
# 127.0.0.1, so they need the OpenSSH server and client binaries. Idempotent and quiet.
set -euo pipefail
if [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >/dev/null
$SUDO apt-get install -y -q --no-install-recommends openssh-server openssh-client >/dev/null
# The package's own service is not needed (tests start sshd -D on a free port); make sure the
# privilege-separation directory exists, since sshd refuses to start without it.
$SUDO mkdir -p /run/sshd
echo "setup_sshd: $(/usr/sbin/sshd -V 2>&1 | head -1 || true)"
