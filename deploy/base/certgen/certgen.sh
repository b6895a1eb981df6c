#!/bin/sh
# dynmig-certgen: makes the TLS material of the dynmig webhook and extender and hands the CA to the API server.
#
#   1. Reuses the CA in the existing Secret (mounted read-only at $EXISTING_DIR) while it is valid for more than
#      $RENEW_DAYS days, else makes a new one (ECDSA P-256, $CA_DAYS days).
#   2. Reuses the serving certificate while it is valid for more than $RENEW_DAYS days, is signed by that CA, has
#      the key next to it and names every Service in $SERVICES; else issues a new one ($CERT_DAYS days) for
#      <svc>, <svc>.<ns>, <svc>.<ns>.svc and <svc>.<ns>.svc.cluster.local of each Service.
#   3. Reuses the extender client certificate (client.crt, client.key: kube-scheduler presents it to the extender's
#      /filter and /bind) on the same terms (CN $CLIENT_CN, extendedKeyUsage clientAuth); else issues a new one.
#   4. Writes the Secret $SECRET_NAME (type kubernetes.io/tls: tls.crt, tls.key, ca.crt, ca.key, client.crt,
#      client.key) if anything changed.
#   5. Sets clientConfig.caBundle of every webhook named in $MUTATING_WEBHOOKS / $VALIDATING_WEBHOOKS
#      ("<configuration>/<webhook>" entries) with a strategic merge patch, every time.
#
# Keeping a valid CA means a renewed serving certificate needs no new caBundle: pods still serving the old
# certificate stay trusted until they restart. Talks to the API server with curl and the pod's ServiceAccount
# token; needs only: secrets create, secrets/<name> update, and patch of the two webhook configurations.
set -eu

NAMESPACE=${NAMESPACE:-dynmig-system}
SECRET_NAME=${SECRET_NAME:-dynmig-tls}
SERVICES=${SERVICES:-"dynmig-webhook dynmig-scheduler"}
MUTATING_WEBHOOKS=${MUTATING_WEBHOOKS:-"dynmig-webhook/mutate.dynmig.io"}
VALIDATING_WEBHOOKS=${VALIDATING_WEBHOOKS:-"dynmig-webhook/validate.dynmig.io"}
EXISTING_DIR=${EXISTING_DIR:-/var/run/dynmig/existing-tls}
CLIENT_CN=${CLIENT_CN:-system:kube-scheduler}
SA_DIR=${SA_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}
CA_DAYS=${CA_DAYS:-3650}
CERT_DAYS=${CERT_DAYS:-1825}
RENEW_DAYS=${RENEW_DAYS:-30}
if [ -z "${KUBE_API:-}" ]; then
  host=${KUBERNETES_SERVICE_HOST:?KUBERNETES_SERVICE_HOST is not set: not in a pod? set KUBE_API}
  case "$host" in *:*) host="[$host]" ;; esac
  KUBE_API="https://$host:${KUBERNETES_SERVICE_PORT:-443}"
fi

log() { echo "certgen: $*"; }
die() { echo "certgen: error: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/certgen.XXXXXX")
trap 'rm -rf "$work"' EXIT
umask 077
renew_seconds=$((RENEW_DAYS * 86400))

# The header file keeps the token off curl's command line.
[ -r "$SA_DIR/token" ] || die "cannot read the ServiceAccount token $SA_DIR/token"
printf 'Authorization: Bearer %s\n' "$(cat "$SA_DIR/token")" >"$work/auth"

# api METHOD PATH CONTENT_TYPE BODY_FILE: prints the HTTP code; the response body is left in $work/response.
# A transport failure (curl's message is on stderr) prints 000.
api() {
  : >"$work/response"
  curl -sS --cacert "$SA_DIR/ca.crt" -H @"$work/auth" -H "Accept: application/json" \
    -H "Content-Type: $3" -X "$1" --data-binary @"$4" -o "$work/response" -w '%{http_code}' \
    "$KUBE_API$2" >"$work/code" || echo 000 >"$work/code"
  cat "$work/code"
}

b64() { base64 -w0 <"$1"; }

# --- CA -------------------------------------------------------------------------------------------------------
ca_ok=false
if [ -s "$EXISTING_DIR/ca.crt" ] && [ -s "$EXISTING_DIR/ca.key" ]; then
  cp "$EXISTING_DIR/ca.crt" "$work/ca.crt"
  cp "$EXISTING_DIR/ca.key" "$work/ca.key"
  if openssl x509 -in "$work/ca.crt" -noout -checkend "$renew_seconds" >/dev/null 2>&1 &&
    [ "$(openssl x509 -in "$work/ca.crt" -noout -pubkey 2>/dev/null)" = \
      "$(openssl pkey -in "$work/ca.key" -pubout 2>/dev/null)" ]; then
    ca_ok=true
  fi
fi
if $ca_ok; then
  log "CA reused ($(openssl x509 -in "$work/ca.crt" -noout -enddate))"
else
  cat >"$work/ca.cnf" <<CNF
[req]
distinguished_name = dn
prompt = no
x509_extensions = v3_ca
[dn]
CN = dynmig-ca
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
CNF
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/ca.key" 2>/dev/null ||
    die "openssl could not generate the CA key"
  openssl req -x509 -new -config "$work/ca.cnf" -key "$work/ca.key" -days "$CA_DAYS" \
    -set_serial "0x$(openssl rand -hex 15)" -out "$work/ca.crt" 2>"$work/openssl.err" ||
    die "openssl could not make the CA: $(cat "$work/openssl.err")"
  log "CA created ($(openssl x509 -in "$work/ca.crt" -noout -enddate))"
fi

# --- serving certificate --------------------------------------------------------------------------------------
dns_names=""
for svc in $SERVICES; do
  dns_names="$dns_names $svc $svc.$NAMESPACE $svc.$NAMESPACE.svc $svc.$NAMESPACE.svc.cluster.local"
done
first_svc=${SERVICES%% *}

cert_ok=false
if $ca_ok && [ -s "$EXISTING_DIR/tls.crt" ] && [ -s "$EXISTING_DIR/tls.key" ]; then
  cp "$EXISTING_DIR/tls.crt" "$work/tls.crt"
  cp "$EXISTING_DIR/tls.key" "$work/tls.key"
  if openssl x509 -in "$work/tls.crt" -noout -checkend "$renew_seconds" >/dev/null 2>&1 &&
    openssl verify -CAfile "$work/ca.crt" "$work/tls.crt" >/dev/null 2>&1 &&
    [ "$(openssl x509 -in "$work/tls.crt" -noout -pubkey 2>/dev/null)" = \
      "$(openssl pkey -in "$work/tls.key" -pubout 2>/dev/null)" ]; then
    # Every expected name must be a SAN (", "-separated "DNS:name" entries).
    sans=", $(openssl x509 -in "$work/tls.crt" -noout -ext subjectAltName 2>/dev/null | tail -n +2 |
      tr -d ' \n' | sed 's/,/, /g'),"
    cert_ok=true
    for name in $dns_names; do
      case "$sans" in *", DNS:$name,"*) ;; *) cert_ok=false ;; esac
    done
  fi
fi
if $cert_ok; then
  log "serving certificate reused ($(openssl x509 -in "$work/tls.crt" -noout -enddate))"
else
  san=""
  for name in $dns_names; do san="${san:+$san,}DNS:$name"; done
  cat >"$work/leaf.ext" <<EXT
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EXT
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/tls.key" 2>/dev/null ||
    die "openssl could not generate the serving key"
  openssl req -new -key "$work/tls.key" -subj "/CN=$first_svc.$NAMESPACE.svc" -out "$work/tls.csr" \
    2>"$work/openssl.err" || die "openssl could not make the CSR: $(cat "$work/openssl.err")"
  openssl x509 -req -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -days "$CERT_DAYS" \
    -set_serial "0x$(openssl rand -hex 15)" -extfile "$work/leaf.ext" -out "$work/tls.crt" \
    2>"$work/openssl.err" || die "openssl could not sign the serving certificate: $(cat "$work/openssl.err")"
  log "serving certificate issued for$dns_names ($(openssl x509 -in "$work/tls.crt" -noout -enddate))"
fi

# --- extender client certificate (kube-scheduler) -------------------------------------------------------------
client_ok=false
if $ca_ok && [ -s "$EXISTING_DIR/client.crt" ] && [ -s "$EXISTING_DIR/client.key" ]; then
  cp "$EXISTING_DIR/client.crt" "$work/client.crt"
  cp "$EXISTING_DIR/client.key" "$work/client.key"
  if openssl x509 -in "$work/client.crt" -noout -checkend "$renew_seconds" >/dev/null 2>&1 &&
    openssl verify -CAfile "$work/ca.crt" -purpose sslclient "$work/client.crt" >/dev/null 2>&1 &&
    [ "$(openssl x509 -in "$work/client.crt" -noout -subject -nameopt RFC2253 2>/dev/null)" = \
      "subject=CN=$CLIENT_CN" ] &&
    [ "$(openssl x509 -in "$work/client.crt" -noout -pubkey 2>/dev/null)" = \
      "$(openssl pkey -in "$work/client.key" -pubout 2>/dev/null)" ]; then
    client_ok=true
  fi
fi
if $client_ok; then
  log "client certificate reused ($(openssl x509 -in "$work/client.crt" -noout -enddate))"
else
  cat >"$work/client.ext" <<EXT
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EXT
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/client.key" 2>/dev/null ||
    die "openssl could not generate the client key"
  openssl req -new -key "$work/client.key" -subj "/CN=$CLIENT_CN" -out "$work/client.csr" \
    2>"$work/openssl.err" || die "openssl could not make the client CSR: $(cat "$work/openssl.err")"
  openssl x509 -req -in "$work/client.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -days "$CERT_DAYS" \
    -set_serial "0x$(openssl rand -hex 15)" -extfile "$work/client.ext" -out "$work/client.crt" \
    2>"$work/openssl.err" || die "openssl could not sign the client certificate: $(cat "$work/openssl.err")"
  log "client certificate issued for $CLIENT_CN ($(openssl x509 -in "$work/client.crt" -noout -enddate))"
fi

# --- Secret ---------------------------------------------------------------------------------------------------
if $ca_ok && $cert_ok && $client_ok; then
  log "secret $NAMESPACE/$SECRET_NAME unchanged"
else
  cat >"$work/secret.json" <<JSON
{"apiVersion":"v1","kind":"Secret","type":"kubernetes.io/tls",
 "metadata":{"name":"$SECRET_NAME","namespace":"$NAMESPACE",
  "labels":{"app.kubernetes.io/name":"dynmig","app.kubernetes.io/component":"certgen"}},
 "data":{"tls.crt":"$(b64 "$work/tls.crt")","tls.key":"$(b64 "$work/tls.key")",
  "ca.crt":"$(b64 "$work/ca.crt")","ca.key":"$(b64 "$work/ca.key")",
  "client.crt":"$(b64 "$work/client.crt")","client.key":"$(b64 "$work/client.key")"}}
JSON
  code=$(api POST "/api/v1/namespaces/$NAMESPACE/secrets" application/json "$work/secret.json")
  case "$code" in
    201 | 200) log "secret $NAMESPACE/$SECRET_NAME created" ;;
    409)
      # Exists (an invalid or expiring one, or created meanwhile): replace it. Secrets allow an update without
      # a resourceVersion.
      code=$(api PUT "/api/v1/namespaces/$NAMESPACE/secrets/$SECRET_NAME" application/json "$work/secret.json")
      [ "$code" = 200 ] || die "PUT secret $NAMESPACE/$SECRET_NAME: HTTP $code: $(cat "$work/response" 2>/dev/null)"
      log "secret $NAMESPACE/$SECRET_NAME updated"
      ;;
    *) die "POST secret $NAMESPACE/$SECRET_NAME: HTTP $code: $(cat "$work/response" 2>/dev/null)" ;;
  esac
fi

# --- caBundle -------------------------------------------------------------------------------------------------
ca_bundle=$(b64 "$work/ca.crt")
patch_ca_bundle() { # RESOURCE ENTRIES
  resource=$1
  for entry in $2; do
    configuration=${entry%%/*}
    webhook=${entry#*/}
    if [ -z "$configuration" ] || [ -z "$webhook" ] || [ "$configuration" = "$entry" ]; then
      die "bad webhook entry '$entry': want <configuration>/<webhook>"
    fi
    printf '{"webhooks":[{"name":"%s","clientConfig":{"caBundle":"%s"}}]}' "$webhook" "$ca_bundle" \
      >"$work/patch.json"
    code=$(api PATCH "/apis/admissionregistration.k8s.io/v1/$resource/$configuration" \
      application/strategic-merge-patch+json "$work/patch.json")
    [ "$code" = 200 ] ||
      die "PATCH $resource/$configuration (webhook $webhook): HTTP $code: $(cat "$work/response" 2>/dev/null)"
    log "caBundle set on $resource/$configuration webhook $webhook"
  done
}
patch_ca_bundle mutatingwebhookconfigurations "$MUTATING_WEBHOOKS"
patch_ca_bundle validatingwebhookconfigurations "$VALIDATING_WEBHOOKS"
log "done"
