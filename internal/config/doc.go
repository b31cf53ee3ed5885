// Package config reads the configuration of the sluice serve service: a
// YAML file turned into a validated Config, or Default without a file.
//
// Parsing is pure (Parse takes the file's bytes; Load only reads the file)
// and strict: an unknown key, a key given twice, a value of the wrong type,
// an anchor, alias or merge key, a second document and an empty file are
// refused. Every problem found is reported, not just the first, each as an
// *Error naming the line, the field's path (policies.login.limits[1]), the
// bad value and the values allowed; all wrap ErrInvalid, which wraps
// sluice.ErrInvalidOption. A URL's password and a bearer token are never
// shown, in an error or in Describe.
//
// Config.Version is a hash of the file's bytes, for the status endpoint
// and metrics; Describe prints what the configuration would run, and
// Warnings what it allows but is likely not meant. The package imports no
// store: building the stores, and checking that the store decides each
// limit exactly (sluice.CheckLimit), is the service's.
//
// # Example
//
// Every key is optional except policies; docs/config.md gives each key's
// default and allowed values.
//
//	# A sluice serve configuration with every key (docs/config.md).
//	listen:
//	  http: ":8080"             # the HTTP API; default ":8080"
//	  grpc: ":8081"             # sluice.v1 and Envoy's rate-limit service
//	  admin: "127.0.0.1:9090"   # metrics and health, unauthenticated: loopback
//	auth:
//	  # The bearer tokens of the HTTP API, one per line, never in this file;
//	  # or bearer_tokens_env: SLUICE_TOKENS. Neither: no authentication.
//	  bearer_tokens_file: /etc/sluice/tokens
//	store:
//	  type: redis               # memory (the default), redis or postgres
//	  on_limit_change: keep     # keep (the default), scale or reset
//	  request_id_ttl: 5m        # how long an allowed request ID is remembered
//	  redis:
//	    # Exactly one of url, cluster and sentinel.
//	    cluster: ["10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"]
//	    # url: "redis://redis.internal:6379/0"
//	    # sentinel: {master: mymaster, addrs: ["10.0.0.1:26379"]}
//	    username: sluice
//	    password_env: REDIS_PASSWORD  # the password, from the environment
//	    tls: true
//	    prefix: "sluice:"
//	    # batch: 64             # decisions per pipeline; 1: none
//	    # pipelines: 2          # pipelines in flight
//	  # memory: {max_keys: 1048576, overflow: refuse, max_request_ids: 262144}
//	  # postgres:
//	  #   url: "postgres://sluice@db.internal/sluice"  # password: PGPASSWORD
//	  #   schema: public
//	  #   table: sluice_buckets
//	  #   statement_timeout: 200ms  # of each decision on the server
//	  #   lock_timeout: 100ms       # of its wait for a bucket's row lock
//	  #   per_transaction_timeouts: false  # true behind PgBouncer
//	  #   batch: 64                 # takes per shared transaction; 1: none
//	  #   transactions: 2           # takes in flight before others queue to share
//	guard:
//	  timeout: 15ms             # of every store call; keep it below the callers'
//	  failure_mode: local       # local (the default), closed or open
//	  local_divisor: 3          # for local: the instances sharing the store
//	  local_max_keys: 65536
//	  breaker:
//	    consecutive_failures: 5 # 0 turns this trigger off
//	    failure_percent: 50     # of at least min_calls in window; 0: off
//	    window: 1s
//	    min_calls: 10
//	    probe_interval: 500ms
//	policies:
//	  api:
//	    limit: "100 10/s"       # a burst of 100 per key, refilled at 10 a second
//	  login:
//	    limits: ["5 5/m", "20 20/d"]  # decided together: allowed if both allow
//	  export:
//	    limit: "10 1/h"
//	    shadow: true            # decided and counted, but always allowed
//	envoy:
//	  # envoyproxy/ratelimit config files (a file or a directory), read as
//	  # they are: each descriptor rule is a policy of its own.
//	  config: /etc/ratelimit/config
//	  legacy_headers: false     # also RateLimit-Limit, -Remaining, -Reset
//
// Without a config file the service runs DefaultYAML: the in-memory store
// and the policy "default" of "100 10/s".
package config
