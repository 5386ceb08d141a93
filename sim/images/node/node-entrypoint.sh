#!/bin/bash
# SIMULATION: start a simulated Spark node: install the keys `sim up` made, run sshd, then
# run this node's own Docker engine (overlay2 on the named volume at /var/lib/docker).
set -euo pipefail
conf=/etc/sparkvllm-sim
install -d -m 0700 /root/.ssh
install -m 0600 "$conf/authorized_keys" /root/.ssh/authorized_keys
install -m 0600 "$conf/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
install -m 0644 "$conf/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
install -m 0644 "$conf/ssh_known_hosts" /etc/ssh/ssh_known_hosts
install -d -m 0755 /run/sshd
/usr/sbin/sshd -e
exec /usr/sbin/dockerd --storage-driver overlay2 --host unix:///var/run/docker.sock
