#!/bin/sh
# A project set up and torn down with the JSON API alone (curl and jq), as an
# infrastructure script would: api/README.md › Scripting a project.
#
#   RELAY_URL=https://relay.example.com RELAY_EMAIL=… RELAY_PASSWORD=… \
#     WEBHOOK_URL=https://hooks.example.com/relay sh project.sh up NAME
#   … sh project.sh down PROJECT_ID
#
# up creates project NAME and configures it: the webhook (WEBHOOK_URL, with
# the channel and presence events), a channel budget (CHANNEL_RATE_LIMIT
# messages per minute, default 600), client emit (its secret made), channel
# authorization (on, its secret made); it prints one JSON object with the
# project, its keys and secrets, and its settings as the API answers them.
# down deletes the project with everything it holds. Any refusal stops the
# script with the API's answer on stderr and a non-zero exit; a project that
# up created and could not configure is deleted again.
set -eu
: "${RELAY_URL:?set RELAY_URL}" "${RELAY_EMAIL:?set RELAY_EMAIL}" "${RELAY_PASSWORD:?set RELAY_PASSWORD}"
jar=$(mktemp)
undo="" # the project to delete if up stops half-way
cleanup() {
  [ -z "$undo" ] || (api DELETE "$undo" >/dev/null) || true
  rm -f "$jar"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP # so that a kill runs cleanup too

# api METHOD PATH [BODY]: one JSON call with the session cookie; its answer
# on stdout, or on stderr with a non-zero exit when refused. A BODY of @-
# is read from stdin (the password stays off every command line).
api() {
  method=$1 path=$2
  shift 2
  [ $# -eq 0 ] || set -- --data "$1"
  if ! answer=$(curl --silent --show-error --fail-with-body --cookie "$jar" --cookie-jar "$jar" \
    -X "$method" -H 'Content-Type: application/json' "$@" "$RELAY_URL$path"); then
    echo "project.sh: $method $path refused: $answer" >&2
    exit 1
  fi
  printf '%s\n' "$answer"
}

jq -n '{email: env.RELAY_EMAIL, password: env.RELAY_PASSWORD}' | api POST /api/auth/login @- >/dev/null

case "${1:-}" in
up)
  name=${2:?usage: project.sh up NAME}
  : "${WEBHOOK_URL:?set WEBHOOK_URL}"
  created=$(api POST /api/projects "$(jq -n --arg n "$name" '{name: $n}')")
  id=$(echo "$created" | jq -r .project.id)
  p=/api/projects/$id
  undo=$p
  api PATCH "$p/settings" "$(jq -n --arg u "$WEBHOOK_URL" --argjson l "${CHANNEL_RATE_LIMIT:-600}" \
    '{webhookUrl: $u, webhookEvents: {channel: true, presence: true}, channelRateLimit: $l}')" >/dev/null
  webhook=$(api GET "$p/webhook-secret")
  clientEmit=$(api PATCH "$p/client-emit-secret" '{}')
  authz=$(api PATCH "$p/authorization" '{"authorization":true}')
  settings=$(api GET "$p/settings")
  jq -n --argjson c "$created" --argjson s "$settings" --argjson w "$webhook" --argjson e "$clientEmit" --argjson a "$authz" \
    '{project: $c.project, keys: $c.keys, settings: $s, webhookSecret: $w.webhookSecret,
      clientEmitSecret: $e.clientEmitSecret, authorizationSecret: $a.secret}'
  undo=""
  ;;
down)
  api DELETE "/api/projects/${2:?usage: project.sh down PROJECT_ID}" >/dev/null
  ;;
*)
  echo "usage: project.sh up NAME | down PROJECT_ID" >&2
  exit 2
  ;;
esac
