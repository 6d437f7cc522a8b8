#!/usr/bin/env bash
# A throwaway certificate authority and a server certificate for loopback, for the local Kafka
# and PostgreSQL of scripts/kafka.sh and scripts/postgres.sh (tests and trials only).
#
#   scripts/tls-certs.sh DIR     writes DIR/ca.pem (the CA to trust), DIR/server.pem and
#                                DIR/server.key (PKCS#8, unencrypted, mode 0600), valid 30 days,
#                                for 127.0.0.1, ::1 and localhost (subjectAltName)
set -euo pipefail
dir=${1:?usage: $0 DIR}
command -v openssl >/dev/null 2>&1 || { echo "openssl is missing: apt-get install -y openssl" >&2; exit 2; }
mkdir -p "$dir"
cd "$dir"
umask 077
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 30 -subj "/CN=gpusanity local CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
cat >server.ext <<EXT
subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
EXT
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 30 \
  -extfile server.ext 2>/dev/null
rm -f server.csr server.ext ca.srl ca.key
chmod 644 ca.pem server.pem
chmod 600 server.key
