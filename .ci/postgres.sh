#!/usr/bin/env bash
# A throwaway PostgreSQL server for CI: Debian's `postgresql` package, one cluster per
# DIR, listening on a free loopback port.
#
#   .ci/postgres.sh start DIR          install (apt, only if no initdb is found under
#                                      /usr/lib/postgresql/*/bin), initialise DIR/data
#                                      (or reuse it), start on a free port on 127.0.0.1,
#                                      create the role `picomq` (password, CREATEDB) and
#                                      the database `picomq`; writes DIR/pid (postmaster)
#                                      and DIR/env (shell exports: PICOMQ_CI_PG_URL,
#                                      PICOMQ_CI_PG_PORT); server log in DIR/log
#   .ci/postgres.sh createdb DIR NAME  create database NAME owned by `picomq`; prints
#                                      its URL
#   .ci/postgres.sh stop DIR           fast shutdown; a no-op when it is not running
#
# Then: . DIR/env && psql "$PICOMQ_CI_PG_URL" -c 'select 1'
# The role has CREATEDB, so tests can also make a database each over the URL itself:
#   psql "$PICOMQ_CI_PG_URL" -c 'create database t_1'
#
# Postgres refuses to run as root: as root the server runs as the `postgres` user
# (created by the package; `picomq-pg` is created if it is missing). Run as any other
# user, the server runs as that user. The superuser is `postgres`, reachable only over
# the Unix socket (trust, in a 0700 directory); TCP needs the password (scram-sha-256).
#
# When that user cannot reach DIR (e.g. DIR is inside a 0700 `mktemp -d` directory
# or /root) or DIR's path is too long for a Unix socket, the cluster lives in a
# /tmp/picomq-pg.XXXXXX directory instead (named in DIR/pgroot, DIR/data a symlink to
# it); `stop` then deletes that directory and copies the log to DIR/log.
#
# Settings: 127.0.0.1 only, max_connections 200, fsync off unless
# PICOMQ_CI_PG_FSYNC=on (see below), the log in DIR/log.
set -euo pipefail

DB=picomq
ROLE=picomq
PASSWORD=picomq-ci-password
usage() { echo "usage: $0 start|stop DIR | createdb DIR NAME" >&2; exit 2; }
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage

find_bin() {
  local b
  for b in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$b/initdb" ] && [ -x "$b/pg_ctl" ]; then echo "$b"; return 0; fi
  done
  return 1
}

install_postgres() {
  [ "$(id -u)" = 0 ] || { echo "postgres: no initdb under /usr/lib/postgresql/*/bin and" \
    "not root to install it" >&2; exit 1; }
  echo "postgres: installing Debian's postgresql package" >&2
  # No default cluster on 5432 from the package's own postinst.
  mkdir -p /etc/postgresql-common/createcluster.d
  echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.d/picomq-ci.conf
  local apt=(apt-get -y -q -o DPkg::Lock::Timeout=300 install --no-install-recommends postgresql)
  export DEBIAN_FRONTEND=noninteractive
  if ! "${apt[@]}" >"$dir/apt.log" 2>&1; then
    # A clean machine may have no (or stale) package lists.
    apt-get -q -o DPkg::Lock::Timeout=300 update >>"$dir/apt.log" 2>&1 || true
    "${apt[@]}" >>"$dir/apt.log" 2>&1 || {
      echo "postgres: apt-get install postgresql failed; log:" >&2; cat "$dir/apt.log" >&2; exit 1; }
  fi
}

setup_user() {
  pguser=
  [ "$(id -u)" = 0 ] || return 0
  if id postgres >/dev/null 2>&1; then
    pguser=postgres
  else
    pguser=picomq-pg
    id "$pguser" >/dev/null 2>&1 ||
      useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin "$pguser"
  fi
}

# Runs a command as the server's OS user: directly unless we are root.
as_pg() {
  if [ -n "${pguser:-}" ]; then (cd / && runuser -u "$pguser" -- "$@"); else "$@"; fi
}

# Where the cluster's files live: DIR, or the directory named in DIR/pgroot.
root_of() { if [ -f "$dir/pgroot" ]; then cat "$dir/pgroot"; else echo "$dir"; fi; }

# Chooses the root on a first start. The socket `ROOT/sock/.s.PGSQL.PORT` must fit in
# sun_path (107 bytes).
choose_root() {
  if [ -f "$dir/pgroot" ] || [ -f "$dir/data/PG_VERSION" ]; then return; fi
  if [ ${#dir} -le 80 ] && { [ -z "$pguser" ] || runuser -u "$pguser" -- test -x "$dir" 2>/dev/null; }; then
    return
  fi
  local r
  r=$(mktemp -d /tmp/picomq-pg.XXXXXX)
  chmod 755 "$r"
  echo "$r" >"$dir/pgroot"
  ln -sfn "$r/data" "$dir/data"
  ln -sfn "$r/log" "$dir/log"
  echo "postgres: ${pguser:-this user} cannot use $dir for the cluster; it lives in $r" >&2
}

psql_super() { # DATABASE ARGS... as the superuser over the socket
  local db=$1; shift
  as_pg "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$root/sock" -p "$port" -U postgres -d "$db" "$@"
}

# Alive: the process exists and is not a zombie (an orphan waits for its reaper).
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) && [ -n "$st" ] && [ "$st" != Z ]
}

# Running: the recorded pid is alive and is still the cluster's postmaster.
running() {
  [ -f "$dir/pid" ] && [ -f "$root/data/postmaster.pid" ] &&
    [ "$(head -n 1 "$root/data/postmaster.pid")" = "$(cat "$dir/pid")" ] &&
    alive "$(cat "$dir/pid")"
}

case "$cmd" in
start)
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  root=$(root_of)
  if running; then echo "postgres: already running for $dir (pid $(cat "$dir/pid"))" >&2; exit 1; fi
  bin=$(find_bin) || { install_postgres; bin=$(find_bin) ||
    { echo "postgres: no initdb under /usr/lib/postgresql/*/bin after install" >&2; exit 1; }; }
  setup_user
  choose_root
  root=$(root_of)
  case "$root" in *"'"*) echo "postgres: DIR must not contain a single quote" >&2; exit 2 ;; esac
  mkdir -p "$root/sock" "$root/data"
  touch "$root/log"
  chmod 700 "$root/sock" "$root/data"
  [ -z "$pguser" ] || chown "$pguser:" "$root/sock" "$root/data" "$root/log"

  if [ ! -f "$root/data/PG_VERSION" ]; then
    # --no-sync: a CI cluster need not survive a machine crash; it saves 3 s.
    as_pg "$bin/initdb" --no-sync -D "$root/data" -U postgres --auth-local=trust \
      --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
      { echo "postgres: initdb failed; log:" >&2; cat "$dir/initdb.log" >&2; exit 1; }
    echo "include_if_exists = 'picomq-ci.conf'" >>"$root/data/postgresql.conf"
  fi

  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  # Rewritten on each start (the port changes). fsync is off by default: a test
  # cluster need not survive a machine crash, and with it on every CREATE DATABASE
  # costs ~1 s of fsyncs at the next checkpoint on this disk (20 databases: a 23 s
  # shutdown). Killing the server still loses nothing committed (the page cache
  # survives a process). PICOMQ_CI_PG_FSYNC=on keeps it.
  fsync=${PICOMQ_CI_PG_FSYNC:-off}
  case "$fsync" in on|off) ;; *) echo "postgres: PICOMQ_CI_PG_FSYNC must be on or off" >&2; exit 2 ;; esac
  cat >"$root/data/picomq-ci.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
fsync = $fsync
unix_socket_directories = '$root/sock'
max_connections = 200
shared_buffers = 128MB
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
CONF
  [ -z "$pguser" ] || chown "$pguser:" "$root/data/picomq-ci.conf"

  # -w -t: pg_ctl waits (bounded) until the server accepts connections.
  if ! as_pg "$bin/pg_ctl" start -D "$root/data" -l "$root/log" -w -t 60 >/dev/null; then
    echo "postgres: did not start within 60s; log:" >&2
    cat "$root/log" >&2
    exit 1
  fi
  head -n 1 "$root/data/postmaster.pid" >"$dir/pid"

  ready=
  for _ in $(seq 1 100); do
    if "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -d postgres; then ready=1; break; fi
    sleep 0.1
  done
  [ -n "$ready" ] || { echo "postgres: not ready on 127.0.0.1:$port within 10s; log:" >&2
    cat "$root/log" >&2; exit 1; }

  psql_super postgres <<SQL
SELECT format('CREATE ROLE %I LOGIN CREATEDB PASSWORD %L', '$ROLE', '$PASSWORD')
  WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROLE') \gexec
SELECT format('CREATE DATABASE %I OWNER %I', '$DB', '$ROLE')
  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB') \gexec
SQL

  url="postgres://$ROLE:$PASSWORD@127.0.0.1:$port/$DB"
  # Connect as the tests will: over TCP with the password.
  PGCONNECT_TIMEOUT=5 "$bin/psql" -X -q -At "$url" -c 'select 1' >/dev/null ||
    { echo "postgres: cannot connect as $ROLE over TCP; log:" >&2; cat "$root/log" >&2; exit 1; }
  cat >"$dir/env" <<ENV
export PICOMQ_CI_PG_URL=$url
export PICOMQ_CI_PG_PORT=$port
ENV
  echo "postgres $("$bin/postgres" -V | awk '{print $3}') on 127.0.0.1:$port (pid $(cat "$dir/pid")), env in $dir/env"
  ;;
createdb)
  name=${3:-}
  [ -n "$name" ] || usage
  dir=$(cd "$dir" && pwd)
  root=$(root_of)
  running && [ -f "$dir/env" ] || { echo "postgres: not running for $dir" >&2; exit 1; }
  bin=$(find_bin)
  setup_user
  port=$(sed -n 's/^export PICOMQ_CI_PG_PORT=//p' "$dir/env")
  # On stdin: psql interpolates :"name" (quoted as an identifier) there, not in -c.
  echo 'CREATE DATABASE :"name" OWNER :"owner";' |
    psql_super postgres -v name="$name" -v owner="$ROLE"
  echo "postgres://$ROLE:$PASSWORD@127.0.0.1:$port/$name"
  ;;
stop)
  [ -d "$dir" ] || exit 0
  dir=$(cd "$dir" && pwd)
  root=$(root_of)
  if running; then
    pid=$(cat "$dir/pid")
    # SIGINT is Postgres's fast shutdown: no need for the server's user or pg_ctl.
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      echo "postgres: pid $pid still running after 30s; sending SIGQUIT" >&2
      kill -QUIT "$pid" 2>/dev/null || true
      sleep 1
    fi
  fi
  case "$root" in
  /tmp/picomq-pg.*)
    if [ ! -f "$root/data/postmaster.pid" ]; then
      rm -f "$dir/log" "$dir/data"
      cp "$root/log" "$dir/log" 2>/dev/null || true
      rm -rf "$root" "$dir/pgroot"
    fi
    ;;
  esac
  ;;
*)
  usage
  ;;
esac
