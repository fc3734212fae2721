#!/usr/bin/env bash
# CI hook (run by scripts/test.sh) for the remote/fleet tests: they start their own throwaway
# sshd on 127.0.0.1 (OpenSSH server + client), and run the sh probe under busybox as well (the
# usual small container without python). Idempotent and quiet: apt's output goes to a log that
# is shown only if the install fails.
set -euo pipefail
need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null && command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v busybox >/dev/null || need+=(busybox-static)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  log=$(mktemp)
  export DEBIAN_FRONTEND=noninteractive
  if ! { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
    echo "setup_sshd: apt-get install ${need[*]} failed:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
  rm -f "$log"
  echo "setup_sshd: installed ${need[*]}"
fi
# sshd refuses to start without its privilege-separation directory (the tests start sshd -D
# themselves on a free port; the package's own service is not used).
if [ "$(id -u)" = 0 ]; then mkdir -p /run/sshd; fi
