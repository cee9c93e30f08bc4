#!/usr/bin/env bash
# Start a throw-away PostgreSQL cluster on 127.0.0.1 and a free port, owned
# by this run, and print its URL on stdout (the only stdout line).
#
#   url=$(bash .ci/postgres.sh start DIR)   # DIR: where the cluster lives
#   bash .ci/postgres.sh stop DIR           # immediate stop; the data stays
#   bash .ci/postgres.sh up DIR             # start it again, same port and data
#
# initdb refuses root, so the server's binaries run as the `postgres` user
# with a data directory it owns. Debian keeps them off PATH, in
# /usr/lib/postgresql/<version>/bin; the package is installed if missing.
set -euo pipefail
cmd=${1:?start|stop|up}
dir=${2:?cluster directory}

find_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$d" ] && command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir)
  fi
  echo "$d"
}

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# The server's options: its port ($1) on 127.0.0.1 and its socket in $dir.
# Throw-away test cluster: durability is not what is under test here.
run_server() {
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $1 -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start >&2
}

case "$cmd" in
start)
  bin=$(find_bin)
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    echo "installing postgresql" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    bin=$(find_bin)
  fi
  [ -x "$bin/initdb" ] || { echo "no PostgreSQL server binaries found" >&2; exit 1; }
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$dir"
  rm -rf "$dir/data"
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$dir"; fi
  as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1
  run_server "$port"
  as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -qc "CREATE DATABASE dagwerk_test" >&2
  echo "$port" >"$dir/port"
  echo "postgresql://postgres@127.0.0.1:$port/dagwerk_test"
  ;;
up)
  bin=$(find_bin)
  run_server "$(cat "$dir/port")"
  ;;
stop)
  bin=$(find_bin)
  if [ -d "$dir/data" ]; then
    as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate stop >&2 || true
  fi
  ;;
*)
  echo "usage: $0 start|stop|up DIR" >&2
  exit 2
  ;;
esac
