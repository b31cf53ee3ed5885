-- The schema of the sluice PostgreSQL store (pgstore), applied by
-- (*Store).Migrate in one transaction, with the quoted names of the tables,
-- indexes and functions made from Options.Schema and Options.Table. Every
-- statement is idempotent: running Migrate again changes nothing but the
-- function bodies, which it replaces with this version's.
--
-- Schema version 3 keys buckets and request IDs by (policy, key): a policy
-- column leads both primary keys. Migrate upgrades a schema of version 1
-- or 2 in place: their rows are kept under the policy '' (which no request
-- can name, since a policy name is never empty), and their functions'
-- signatures are kept as wrappers that decide under that policy, so that
-- processes of those versions keep deciding on their own buckets while a
-- deployment rolls over (see docs/postgres.md).
--
-- Schema version 5 replaces the index on full_at with one on sweep_at,
-- full_at in units of about 8 seconds, so that an update of a bucket is a heap-only
-- update (see the bucket table). Migrate upgrades older versions in place;
-- no function changes its signature.
--
-- Schema version 4 adds the operations beyond a take: multi-takes and
-- drains ({{.TakeAll}}), refunds ({{.Refund}}) and resets ({{.Reset}}),
-- and the refunded mark of a request ID. Migrate upgrades a schema of
-- version 3 (or older) in place; the take and peek functions keep their
-- signatures, so processes of version 3 keep deciding while a deployment
-- rolls over.
--
-- Units: time is an integer number of microseconds (µs) since the Unix
-- epoch; a limit of capacity C and n tokens every P µs is reduced by
-- g = gcd(n, P) to n' = n/g fraction units added per µs and p' = P/g fraction
-- units per token (n' = 0 and p' = 1 when n = 0). A level is tokens + frac/p'
-- with 0 <= frac < p'. This is bucket.Plan at a tick of 1µs, and every
-- function below computes exactly what Plan computes: intermediates that can
-- exceed 64 bits are numeric (arbitrary precision), never float.

CREATE TABLE IF NOT EXISTS {{.Buckets}} (
	policy      text COLLATE "C" NOT NULL, -- the policy name; '' for rows of schema versions 1 and 2
	key         bytea   NOT NULL,
	tokens      bigint  NOT NULL, -- whole tokens, 0 <= tokens <= capacity
	frac        bigint  NOT NULL, -- fraction units, 0 <= frac < p'
	stamp       bigint  NOT NULL, -- µs: the level is up to date at this instant
	capacity    bigint  NOT NULL, -- the limit the bucket was last decided under
	rate_tokens bigint  NOT NULL,
	period_us   bigint  NOT NULL,
	full_at     bigint,           -- µs: full again from here on; NULL: never
	PRIMARY KEY (policy, key),
	-- The sweeper's index key: full_at in units of 2^23 µs (about 8.4 s).
	-- An allowed take moves full_at by its cost's refill time, a denial
	-- not at all; sweep_at changes only when full_at crosses a unit, so
	-- most updates of a bucket change no indexed column and PostgreSQL
	-- makes them heap-only (HOT): no new index entries, and a hot key's
	-- row stays one index entry long (version 5). The sweeper reads the
	-- buckets of the current unit that are not full yet, and skips them.
	sweep_at    bigint GENERATED ALWAYS AS (full_at >> 23) STORED
) WITH (fillfactor = 75);

CREATE TABLE IF NOT EXISTS {{.RequestIDs}} (
	policy      text COLLATE "C" NOT NULL,
	key         bytea   NOT NULL,
	request_id  bytea   NOT NULL,
	cost        bigint  NOT NULL, -- the first allowed request's cost and limit
	capacity    bigint  NOT NULL,
	rate_tokens bigint  NOT NULL,
	period_us   bigint  NOT NULL,
	allowed     boolean NOT NULL, -- its decision (always true from version 3 on)
	remaining   bigint  NOT NULL,
	retry_us    bigint  NOT NULL, -- µs; -1: never
	reset_us    bigint  NOT NULL, -- µs; -1: never
	expires_at  bigint  NOT NULL, -- µs: forgotten from here on
	refunded    boolean NOT NULL DEFAULT false, -- a refund with this ID has undone the take (version 4)
	PRIMARY KEY (policy, key, request_id)
);

CREATE INDEX IF NOT EXISTS {{.ExpiresIndex}} ON {{.RequestIDs}} (expires_at);

-- Upgrading from schema version 4 or older: their bucket table has no
-- sweep_at and an index on full_at, which made every update of a bucket
-- write index entries. Adding the stored column rewrites the table under
-- an exclusive lock, in the migration's transaction (docs/postgres.md).
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '{{.Buckets}}'::regclass AND attname = 'sweep_at' AND NOT attisdropped) THEN
		ALTER TABLE {{.Buckets}} ADD COLUMN sweep_at bigint GENERATED ALWAYS AS (full_at >> 23) STORED;
	END IF;
END
$$;
DROP INDEX IF EXISTS {{.Schema}}.{{.FullAtIndex}};
CREATE INDEX IF NOT EXISTS {{.SweepIndex}} ON {{.Buckets}} (sweep_at);

-- Upgrading from schema version 1 or 2: their tables have no policy
-- column and are keyed by key alone. Add the column, with the policy ''
-- for every existing row, and lead the primary keys with it (keeping their
-- names). The table is locked for the rebuild of its primary key, in the
-- migration's transaction.
DO $$
DECLARE
	v_table regclass;
	v_columns text;
	v_pkey name;
BEGIN
	FOR v_table, v_columns IN VALUES ('{{.Buckets}}'::regclass, 'policy, key'), ('{{.RequestIDs}}'::regclass, 'policy, key, request_id') LOOP
		CONTINUE WHEN EXISTS (SELECT FROM pg_attribute WHERE attrelid = v_table AND attname = 'policy' AND NOT attisdropped);
		SELECT conname INTO STRICT v_pkey FROM pg_constraint WHERE conrelid = v_table AND contype = 'p';
		EXECUTE format('ALTER TABLE %s ADD COLUMN policy text COLLATE "C" NOT NULL DEFAULT %L', v_table, '');
		EXECUTE format('ALTER TABLE %s ALTER COLUMN policy DROP DEFAULT', v_table);
		EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', v_table, v_pkey);
		EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (%s)', v_table, v_pkey, v_columns);
	END LOOP;
END
$$;

-- Upgrading from schema version 3 or older: their request IDs have no
-- refunded mark; none of them was refunded. With a constant default this
-- changes only the catalog, under a short exclusive lock of the table,
-- which is taken only when the column is missing.
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '{{.RequestIDs}}'::regclass AND attname = 'refunded' AND NOT attisdropped) THEN
		ALTER TABLE {{.RequestIDs}} ADD COLUMN refunded boolean NOT NULL DEFAULT false;
	END IF;
END
$$;

-- The sweep floor: the time of the latest sweep. A bucket is never created
-- with a stamp before it, so that a take whose time was read before a
-- sweep deleted its (full) bucket cannot recreate the bucket full at that
-- earlier time, when it was not full (see {{.Take}}). One row. Roles get
-- the privileges on it that they have on the bucket table when it is
-- created by an upgrade.
DO $$
DECLARE
	v_grant record;
BEGIN
	IF to_regclass('{{.Floor}}') IS NOT NULL THEN
		RETURN;
	END IF;
	CREATE TABLE {{.Floor}} (
		one      boolean PRIMARY KEY DEFAULT true CHECK (one),
		floor_us bigint  NOT NULL -- µs: no bucket is created with an earlier stamp
	);
	INSERT INTO {{.Floor}} (floor_us) VALUES (-9223372036854775808);
	FOR v_grant IN
		SELECT a.grantee, a.privilege_type, a.is_grantable
		FROM pg_class AS c, aclexplode(c.relacl) AS a
		WHERE c.oid = '{{.Buckets}}'::regclass AND a.privilege_type IN ('SELECT', 'UPDATE')
			AND a.grantee <> (SELECT relowner FROM pg_class WHERE oid = '{{.Floor}}'::regclass)
	LOOP
		EXECUTE format('GRANT %s ON %s TO %s%s', v_grant.privilege_type, '{{.Floor}}',
			CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(v_grant.grantee)) END,
			CASE WHEN v_grant.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
	END LOOP;
END
$$;

COMMENT ON TABLE {{.Buckets}} IS 'sluice pgstore token buckets, schema version {{.Version}}';
COMMENT ON TABLE {{.RequestIDs}} IS 'sluice pgstore request IDs, schema version {{.Version}}';
COMMENT ON TABLE {{.Floor}} IS 'sluice pgstore sweep floor, schema version {{.Version}}';

-- {{.Clock}}() is the database clock in µs since the Unix epoch.
-- extract(epoch ...) is numeric (exact) from PostgreSQL 14 on.
CREATE OR REPLACE FUNCTION {{.Clock}}() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
	SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

-- {{.Wait}} returns the µs, rounded up, until a level of p_tokens + p_frac/p_per
-- stamped p_stamp reaches p_target tokens at n' = p_n units per µs, measured
-- from p_now: when p_now is before the stamp (the caller's clock is behind
-- it), the µs from p_now to the stamp are added. It is 0 if the level is
-- there already, -1 (never) if it never gets there or the wait is longer
-- than a Go time.Duration holds (9223372036854775 µs). This is bucket.Plan's
-- wait. Versions 1 and 2 measured from the stamp. This and {{.FullAt}} are a
-- single expression with no subquery, so that PostgreSQL inlines them into
-- the calling statement: a call of a SQL function that is not inlined costs
-- more than the rest of a decision's arithmetic.
DROP FUNCTION IF EXISTS {{.Wait}}(bigint, bigint, bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION {{.Wait}}(
	p_tokens bigint, p_frac bigint, p_target bigint, p_n bigint, p_per bigint, p_stamp bigint, p_now bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
	SELECT CASE
		WHEN p_tokens >= p_target THEN 0
		WHEN p_n = 0 THEN -1
		WHEN div((p_target - p_tokens)::numeric * p_per - p_frac + (p_n - 1), p_n) + greatest(p_stamp::numeric - p_now, 0) > 9223372036854775 THEN -1
		ELSE (div((p_target - p_tokens)::numeric * p_per - p_frac + (p_n - 1), p_n) + greatest(p_stamp::numeric - p_now, 0))::bigint
	END
$$;

-- {{.FullAt}} returns the µs from which a level of p_tokens + p_frac/p_per
-- stamped p_stamp is full again if nothing is taken, which the sweeper reads:
-- bucket.Plan.FullAt, with NULL for its math.MaxInt64 (never, or beyond 64
-- bits).
CREATE OR REPLACE FUNCTION {{.FullAt}}(
	p_tokens bigint, p_frac bigint, p_stamp bigint, p_cap bigint, p_n bigint, p_per bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
	SELECT CASE
		WHEN p_tokens >= p_cap THEN p_stamp
		WHEN p_n = 0 THEN NULL
		WHEN div((p_cap - p_tokens)::numeric * p_per - p_frac + (p_n - 1), p_n) > 9223372036854775807 THEN NULL
		WHEN p_stamp + div((p_cap - p_tokens)::numeric * p_per - p_frac + (p_n - 1), p_n) >= 9223372036854775807 THEN NULL
		ELSE (p_stamp + div((p_cap - p_tokens)::numeric * p_per - p_frac + (p_n - 1), p_n))::bigint
	END
$$;

-- {{.RefillTokens}} and {{.RefillFrac}} are the level of a bucket of
-- p_tokens + p_frac/p_per tokens stamped p_stamp at p_now, under the limit
-- it was stored with (capacity p_cap, p_n units per µs): {{.Advance}}
-- when the limit has not changed, as two expressions that PostgreSQL
-- inlines into the expression that calls them (a call of {{.Advance}},
-- not inlined, costs more than its arithmetic).
CREATE OR REPLACE FUNCTION {{.RefillTokens}}(
	p_tokens bigint, p_frac bigint, p_stamp bigint, p_cap bigint, p_n bigint, p_per bigint, p_now bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
	SELECT CASE
		WHEN p_now <= p_stamp OR p_n = 0 OR p_tokens >= p_cap THEN p_tokens
		WHEN (p_now::numeric - p_stamp) * p_n >= (p_cap - p_tokens)::numeric * p_per - p_frac THEN p_cap
		ELSE p_tokens + div((p_now::numeric - p_stamp) * p_n + p_frac, p_per)::bigint
	END
$$;

CREATE OR REPLACE FUNCTION {{.RefillFrac}}(
	p_tokens bigint, p_frac bigint, p_stamp bigint, p_cap bigint, p_n bigint, p_per bigint, p_now bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
	SELECT CASE
		WHEN p_now <= p_stamp OR p_n = 0 OR p_tokens >= p_cap THEN p_frac
		WHEN (p_now::numeric - p_stamp) * p_n >= (p_cap - p_tokens)::numeric * p_per - p_frac THEN 0
		ELSE mod((p_now::numeric - p_stamp) * p_n + p_frac, p_per)::bigint
	END
$$;

-- {{.Advance}} brings a stored bucket up to date at p_now under the request's
-- limit (p_cap, p_rate_tokens, p_period; reduced to p_n, p_per):
--   2. now' = max(now, stamp): a clock that steps back refills nothing and
--      never moves the stamp back;
--   3. refill under the bucket's own (old) limit: the deficit to full is
--      D = (C - tokens)*p' - frac units, the refill A = (now' - stamp)*n';
--      A >= D is full, else (frac + A) is divided by p';
--   then, if the request carries another limit, convert the level by
--   p_conversion (0 keep, 1 scale, 2 reset), rounding down to the new grid.
--   A bucket that is full under its old limit is full under the new one.
-- This is bucket.Plan.Refill followed by bucket.Plan.Convert. Versions 1
-- and 2 named p_conversion p_policy, which CREATE OR REPLACE cannot rename.
DO $$
DECLARE
	v_names text[];
BEGIN
	SELECT proargnames INTO v_names FROM pg_proc
	WHERE oid = to_regprocedure('{{.Advance}}(bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, integer, bigint)');
	IF 'p_policy' = ANY (v_names) THEN
		DROP FUNCTION {{.Advance}}(bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint, integer, bigint);
	END IF;
END
$$;

CREATE OR REPLACE FUNCTION {{.Advance}}(
	p_tokens bigint, p_frac bigint, p_stamp bigint,
	p_old_cap bigint, p_old_rate_tokens bigint, p_old_period bigint,
	p_cap bigint, p_rate_tokens bigint, p_period bigint, p_n bigint, p_per bigint,
	p_conversion integer, p_now bigint,
	OUT o_tokens bigint, OUT o_frac bigint, OUT o_stamp bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
	v_same boolean := p_old_cap = p_cap AND p_old_rate_tokens = p_rate_tokens AND p_old_period = p_period;
	v_n bigint := p_n;
	v_per bigint := p_per;
	v_g bigint;
	v_deficit numeric;
	v_units numeric;
BEGIN
	o_tokens := p_tokens;
	o_frac := p_frac;
	o_stamp := p_stamp;
	IF NOT v_same THEN
		-- gcd(0, P) = P, so a limit that never refills gets n' = 0, p' = 1.
		v_g := gcd(p_old_rate_tokens, p_old_period);
		v_n := p_old_rate_tokens / v_g;
		v_per := p_old_period / v_g;
	END IF;
	IF p_now > o_stamp THEN
		IF v_n <> 0 AND o_tokens < p_old_cap THEN
			v_deficit := (p_old_cap - o_tokens)::numeric * v_per - o_frac;
			v_units := (p_now::numeric - o_stamp) * v_n;
			IF v_units >= v_deficit THEN
				o_tokens := p_old_cap;
				o_frac := 0;
			ELSE
				-- frac + A < (C - tokens)*p': the quotient stays below C - tokens.
				v_units := v_units + o_frac;
				o_tokens := o_tokens + div(v_units, v_per);
				o_frac := mod(v_units, v_per);
			END IF;
		END IF;
		o_stamp := p_now;
	END IF;
	IF v_same THEN
		RETURN;
	END IF;
	IF o_tokens >= p_old_cap OR p_conversion = 2 THEN
		o_tokens := p_cap;
		o_frac := 0;
	ELSIF p_conversion = 1 THEN
		-- units = floor((tokens*p'_old + frac) * C_new * p'_new / (p'_old * C_old))
		v_units := div((o_tokens::numeric * v_per + o_frac) * p_cap * p_per, v_per::numeric * p_old_cap);
		o_tokens := div(v_units, p_per);
		o_frac := mod(v_units, p_per);
	ELSIF o_tokens >= p_cap THEN
		o_tokens := p_cap;
		o_frac := 0;
	ELSE
		-- frac < p'_old, so the new frac stays below p'_new.
		o_frac := div(o_frac::numeric * p_per, v_per);
	END IF;
	IF o_tokens >= p_cap THEN
		o_tokens := p_cap;
		o_frac := 0;
	END IF;
END
$$;

-- Which of this version's take and peek functions this migration creates
-- (rather than replaces), so that they can be given the privileges of the
-- functions of version 1 or 2 below.
SELECT set_config('sluice_pgstore.created',
	CASE WHEN to_regprocedure('{{.Take}}(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)') IS NULL THEN 'take ' ELSE '' END ||
	CASE WHEN to_regprocedure('{{.Peek}}(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bigint)') IS NULL THEN 'peek' ELSE '' END,
	true);

-- {{.Take}} decides one request: the whole of sluice.Store.Take for requests
-- that passed validation in Go, in one statement at READ COMMITTED.
--
-- The bucket row of (p_policy, p_key) is locked with SELECT ... FOR UPDATE,
-- or, for a missing bucket, by inserting it (a concurrent request for the
-- same bucket waits on the unique index, then finds the row and locks it).
-- Each statement of a volatile PL/pgSQL function takes a new snapshot, so
-- after waiting for the lock the function sees the latest committed bucket,
-- request IDs and sweep floor. The request ID is checked under that lock;
-- an allowed decision is recorded in the same transaction, a denial is not
-- (it consumed nothing, so its retry decides afresh); a remembered one is
-- replayed without consuming anything.
--
-- p_now is the time in µs, or NULL for the database clock, read once, at
-- the start. Waits are measured from it: when it is behind the bucket's
-- stamp (a clock that stepped back, or a take that waited for the lock of a
-- later one), they include the µs from it to the stamp. p_conversion is
-- as for {{.Advance}}; p_ttl is the request ID's lifetime in µs. o_status
-- is 0 for a decision, 1 for a replay, 2 for a request ID remembered with
-- another cost or limit (o_cost and the o_ limit columns are then the
-- remembered ones). o_lock_wait_us is how long the decision waited for the
-- bucket's row lock, in µs of clock_timestamp() (never negative, should
-- that clock step back): 0 if it got the lock at once. o_converted is true
-- when the bucket was stored under another limit than the request's and
-- was converted to it.
CREATE OR REPLACE FUNCTION {{.Take}}(
	p_policy text, p_key bytea, p_cost bigint,
	p_cap bigint, p_rate_tokens bigint, p_period bigint, p_n bigint, p_per bigint,
	p_conversion integer, p_request_id bytea, p_ttl bigint, p_now bigint,
	OUT o_status integer, OUT o_allowed boolean, OUT o_remaining bigint,
	OUT o_retry_us bigint, OUT o_reset_us bigint,
	OUT o_cost bigint, OUT o_capacity bigint, OUT o_rate_tokens bigint, OUT o_period_us bigint,
	OUT o_lock_wait_us bigint, OUT o_converted boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	v_now bigint := coalesce(p_now, {{.Clock}}());
	v_t0 timestamptz;
	v_old record;
	v_id record;
	v_found boolean;
	v_replay boolean := false;
	v_tokens bigint;
	v_frac bigint;
	v_stamp bigint;
	v_floor bigint;
	v_full_at bigint;
	-- Whether every deficit of this limit, (C - tokens)*p' - frac, fits
	-- in 62 bits: then the arithmetic below runs in bigint, with no
	-- intermediate above 2^62 + 2^40 (docs/postgres.md, "The
	-- arithmetic"), else in numeric.
	v_small boolean := p_cap <= 4611686018427387903 / p_per;
	v_c bigint;
	v_e bigint;
BEGIN
	-- The row lock serializes decisions only at READ COMMITTED, where each
	-- statement below sees the latest committed rows. At REPEATABLE READ or
	-- SERIALIZABLE a hot key would fail with serialization errors instead.
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'sluice pgstore: a decision must run at READ COMMITTED, not %', current_setting('transaction_isolation')
			USING ERRCODE = 'invalid_transaction_state',
			HINT = 'Use sessions whose default_transaction_isolation is read committed (the default) for the store''s pool.';
	END IF;
	o_lock_wait_us := 0;
	o_converted := false;
	LOOP
		-- Lock the bucket if no one holds it: the usual case, one index
		-- probe and no clock read.
		SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
		INTO v_old
		FROM {{.Buckets}} AS b WHERE b.policy = p_policy AND b.key = p_key FOR UPDATE SKIP LOCKED;
		IF NOT FOUND THEN
			-- Missing, or held by another transaction (a decision, or a
			-- sweep that is deleting it). Try to create it: the insert's
			-- conflict tells a held row from a missing one, with no probe of
			-- its own. 1. A missing bucket starts full, stamped now (and no
			-- earlier than the sweep floor: see below).
			v_tokens := p_cap;
			v_frac := 0;
			v_stamp := v_now;
			-- 4. and 5. as below, for the new bucket: the cost is at most
			-- the capacity, so it is taken, and the bucket lacks exactly
			-- the cost, which refills in ceil(cost * p' / n') µs.
			v_tokens := v_tokens - p_cost;
			o_allowed := true;
			o_retry_us := 0;
			o_remaining := v_tokens;
			IF v_small AND p_n <> 0 THEN
				v_c := (p_cost * p_per + p_n - 1) / p_n;
				v_full_at := CASE WHEN v_now >= 9223372036854775807 - v_c THEN NULL ELSE v_now + v_c END;
				o_reset_us := CASE WHEN v_c > 9223372036854775 THEN -1 ELSE v_c END;
			ELSE
				v_full_at := {{.FullAt}}(v_tokens, v_frac, v_stamp, p_cap, p_n, p_per);
				o_reset_us := {{.Wait}}(v_tokens, v_frac, p_cap, p_n, p_per, v_stamp, v_now);
			END IF;

			v_t0 := clock_timestamp();
			INSERT INTO {{.Buckets}} AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at)
			VALUES (p_policy, p_key, v_tokens, v_frac, v_stamp, p_cap, p_rate_tokens, p_period, v_full_at)
			ON CONFLICT (policy, key) DO NOTHING;
			IF FOUND THEN
				IF p_request_id IS NOT NULL THEN
					-- The bucket may have been swept (full) after an earlier
					-- decision of this request ID: replay that one and leave
					-- the bucket missing, as it was.
					SELECT r.* INTO v_id FROM {{.RequestIDs}} AS r
					WHERE r.policy = p_policy AND r.key = p_key AND r.request_id = p_request_id AND r.expires_at > v_now;
					IF FOUND THEN
						DELETE FROM {{.Buckets}} WHERE policy = p_policy AND key = p_key;
						v_replay := true;
						EXIT;
					END IF;
				END IF;
				-- A sweep may have deleted this bucket, full at its time, after
				-- v_now was read (while this statement waited for its lock):
				-- a bucket made full at v_now would then hold the tokens it
				-- lacked at v_now. Every such sweep committed before the insert
				-- could succeed and raised the floor to its time, which this
				-- statement's snapshot, taken after the insert, sees: make the
				-- bucket no earlier than that.
				SELECT f.floor_us INTO v_floor FROM {{.Floor}} AS f;
				IF v_floor > v_stamp THEN
					v_stamp := v_floor;
					o_reset_us := {{.Wait}}(v_tokens, v_frac, p_cap, p_n, p_per, v_stamp, v_now);
					v_full_at := {{.FullAt}}(v_tokens, v_frac, v_stamp, p_cap, p_n, p_per);
					UPDATE {{.Buckets}} SET stamp = v_stamp, full_at = v_full_at
					WHERE policy = p_policy AND key = p_key;
				END IF;
				EXIT;
			END IF;
			-- The bucket exists and another transaction holds it, or held
			-- it: if that transaction had changed the row, the insert waited
			-- for it to end. Wait for the lock, and time both waits (the
			-- insert's own work, a few µs, is counted with them).
			SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
			INTO v_old
			FROM {{.Buckets}} AS b WHERE b.policy = p_policy AND b.key = p_key FOR UPDATE;
			v_found := FOUND;
			o_lock_wait_us := o_lock_wait_us + greatest((extract(epoch FROM clock_timestamp() - v_t0) * 1000000)::bigint, 0);
			-- Deleted (by a sweep) while this waited: create it again.
			CONTINUE WHEN NOT v_found;
		END IF;

		IF p_request_id IS NOT NULL THEN
			SELECT r.* INTO v_id FROM {{.RequestIDs}} AS r
			WHERE r.policy = p_policy AND r.key = p_key AND r.request_id = p_request_id AND r.expires_at > v_now;
			IF FOUND THEN
				v_replay := true;
				EXIT;
			END IF;
		END IF;

		o_converted := p_cap <> v_old.capacity OR p_rate_tokens <> v_old.rate_tokens OR p_period <> v_old.period_us;
		IF o_converted THEN
			SELECT a.o_tokens, a.o_frac, a.o_stamp INTO v_tokens, v_frac, v_stamp
			FROM {{.Advance}}(v_old.tokens, v_old.frac, v_old.stamp,
				v_old.capacity, v_old.rate_tokens, v_old.period_us,
				p_cap, p_rate_tokens, p_period, p_n, p_per, p_conversion, v_now) AS a;
		ELSIF v_small AND v_old.stamp >= 0 AND v_now >= 0 THEN
			-- {{.Advance}} under an unchanged limit, in bigint: the elapsed
			-- µs e fill the deficit D when e >= ceil(D / n'); otherwise
			-- e * n' < D, and e * n' + frac < (C - tokens) * p'. The same
			-- statements refill in {{.TakeAll}} and {{.Peek}}: written as
			-- inlined SQL functions (like {{.RefillTokens}}), whose
			-- expressions PL/pgSQL prepares anew in every transaction, the
			-- bigint refill and waits made takes 4-7 % slower (docs/postgres.md).
			v_tokens := v_old.tokens;
			v_frac := v_old.frac;
			v_stamp := v_old.stamp;
			IF v_now > v_stamp THEN
				IF p_n <> 0 AND v_tokens < p_cap THEN
					v_e := v_now - v_stamp;
					IF v_e >= ((p_cap - v_tokens) * p_per - v_frac + p_n - 1) / p_n THEN
						v_tokens := p_cap;
						v_frac := 0;
					ELSE
						v_e := v_e * p_n + v_frac;
						v_tokens := v_tokens + v_e / p_per;
						v_frac := v_e % p_per;
					END IF;
				END IF;
				v_stamp := v_now;
			END IF;
		ELSE
			-- The same in numeric (a limit too large for bigint, or a
			-- time before the Unix epoch).
			v_small := false;
			v_tokens := {{.RefillTokens}}(v_old.tokens, v_old.frac, v_old.stamp, p_cap, p_n, p_per, v_now);
			v_frac := {{.RefillFrac}}(v_old.tokens, v_old.frac, v_old.stamp, p_cap, p_n, p_per, v_now);
			v_stamp := greatest(v_old.stamp, v_now);
		END IF;

		-- 4. Take the cost if the level covers it: frac is less than one
		-- token and the cost is whole, so that is tokens >= cost.
		o_allowed := v_tokens >= p_cost;
		IF o_allowed THEN
			v_tokens := v_tokens - p_cost;
			o_retry_us := 0;
		END IF;
		-- 5. The decision, and when the bucket is full again: {{.Wait}}
		-- and {{.FullAt}}, in bigint when the refill was. There the
		-- stamp is now' >= now, both at least 0, so the µs from now to
		-- the stamp, e, fit, and each sum is compared with its bound
		-- before it is made.
		o_remaining := v_tokens;
		IF v_small AND NOT o_converted THEN
			v_e := v_stamp - v_now;
			IF NOT o_allowed THEN
				o_retry_us := CASE WHEN p_n = 0 THEN -1 ELSE ((p_cost - v_tokens) * p_per - v_frac + p_n - 1) / p_n END;
				o_retry_us := CASE WHEN o_retry_us < 0 OR o_retry_us > 9223372036854775 - v_e THEN -1 ELSE o_retry_us + v_e END;
			END IF;
			IF v_tokens >= p_cap THEN
				o_reset_us := 0;
				v_full_at := v_stamp;
			ELSIF p_n = 0 THEN
				o_reset_us := -1;
				v_full_at := NULL;
			ELSE
				v_c := ((p_cap - v_tokens) * p_per - v_frac + p_n - 1) / p_n;
				o_reset_us := CASE WHEN v_c > 9223372036854775 - v_e THEN -1 ELSE v_c + v_e END;
				v_full_at := CASE WHEN v_stamp >= 9223372036854775807 - v_c THEN NULL ELSE v_stamp + v_c END;
			END IF;
		ELSE
			IF NOT o_allowed THEN
				o_retry_us := {{.Wait}}(v_tokens, v_frac, p_cost, p_n, p_per, v_stamp, v_now);
			END IF;
			o_reset_us := {{.Wait}}(v_tokens, v_frac, p_cap, p_n, p_per, v_stamp, v_now);
			v_full_at := {{.FullAt}}(v_tokens, v_frac, v_stamp, p_cap, p_n, p_per);
		END IF;
		IF v_tokens <> v_old.tokens OR v_frac <> v_old.frac OR v_stamp <> v_old.stamp OR o_converted THEN
			UPDATE {{.Buckets}} SET
				tokens = v_tokens, frac = v_frac, stamp = v_stamp,
				capacity = p_cap, rate_tokens = p_rate_tokens, period_us = p_period,
				full_at = v_full_at
			WHERE policy = p_policy AND key = p_key;
		END IF;
		EXIT;
	END LOOP;

	IF v_replay THEN
		-- A remembered request ID: replay it, or a conflict.
		o_converted := false;
		IF v_id.cost = p_cost AND v_id.capacity = p_cap AND v_id.rate_tokens = p_rate_tokens AND v_id.period_us = p_period THEN
			o_status := 1;
		ELSE
			o_status := 2;
		END IF;
		o_allowed := v_id.allowed;
		o_remaining := v_id.remaining;
		o_retry_us := v_id.retry_us;
		o_reset_us := v_id.reset_us;
		o_cost := v_id.cost;
		o_capacity := v_id.capacity;
		o_rate_tokens := v_id.rate_tokens;
		o_period_us := v_id.period_us;
		RETURN;
	END IF;

	o_status := 0;
	o_cost := p_cost;
	o_capacity := p_cap;
	o_rate_tokens := p_rate_tokens;
	o_period_us := p_period;
	-- (An expired record of the same ID is replaced, its refunded mark
	-- too: the new take has not been refunded.)
	IF p_request_id IS NOT NULL AND o_allowed THEN
		INSERT INTO {{.RequestIDs}} AS r (policy, key, request_id, cost, capacity, rate_tokens, period_us,
			allowed, remaining, retry_us, reset_us, expires_at)
		VALUES (p_policy, p_key, p_request_id, p_cost, p_cap, p_rate_tokens, p_period,
			o_allowed, o_remaining, o_retry_us, o_reset_us,
			least(v_now::numeric + p_ttl, 9223372036854775807)::bigint)
		ON CONFLICT (policy, key, request_id) DO UPDATE SET
			cost = EXCLUDED.cost, capacity = EXCLUDED.capacity,
			rate_tokens = EXCLUDED.rate_tokens, period_us = EXCLUDED.period_us,
			allowed = EXCLUDED.allowed, remaining = EXCLUDED.remaining,
			retry_us = EXCLUDED.retry_us, reset_us = EXCLUDED.reset_us,
			expires_at = EXCLUDED.expires_at, refunded = false;
	END IF;
END
$$;

-- {{.Peek}} reports whether a take of p_cost would succeed now, and when,
-- without locking, writing or creating anything: the whole of
-- sluice.Store.Peek. Waits are measured from p_now as in {{.Take}}.
CREATE OR REPLACE FUNCTION {{.Peek}}(
	p_policy text, p_key bytea, p_cost bigint,
	p_cap bigint, p_rate_tokens bigint, p_period bigint, p_n bigint, p_per bigint,
	p_conversion integer, p_now bigint,
	OUT o_allowed boolean, OUT o_remaining bigint, OUT o_retry_us bigint, OUT o_reset_us bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	v_now bigint := coalesce(p_now, {{.Clock}}());
	v_old record;
	v_tokens bigint := p_cap;
	v_frac bigint := 0;
	v_stamp bigint := v_now;
	-- Whether this peek computes in bigint, as a take does (see {{.Take}}).
	v_small boolean := p_cap <= 4611686018427387903 / p_per AND v_now >= 0;
	v_e bigint;
BEGIN
	SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
	INTO v_old
	FROM {{.Buckets}} AS b WHERE b.policy = p_policy AND b.key = p_key;
	IF NOT FOUND THEN
		NULL; -- a missing bucket is full, stamped now
	ELSIF v_small AND v_old.stamp >= 0 AND p_cap = v_old.capacity AND p_rate_tokens = v_old.rate_tokens AND p_period = v_old.period_us THEN
		-- {{.Advance}} under an unchanged limit, in bigint, as in {{.Take}}.
		v_tokens := v_old.tokens;
		v_frac := v_old.frac;
		v_stamp := v_old.stamp;
		IF v_now > v_stamp THEN
			IF p_n <> 0 AND v_tokens < p_cap THEN
				v_e := v_now - v_stamp;
				IF v_e >= ((p_cap - v_tokens) * p_per - v_frac + p_n - 1) / p_n THEN
					v_tokens := p_cap;
					v_frac := 0;
				ELSE
					v_e := v_e * p_n + v_frac;
					v_tokens := v_tokens + v_e / p_per;
					v_frac := v_e % p_per;
				END IF;
			END IF;
			v_stamp := v_now;
		END IF;
	ELSE
		v_small := false;
		SELECT a.o_tokens, a.o_frac, a.o_stamp INTO v_tokens, v_frac, v_stamp
		FROM {{.Advance}}(v_old.tokens, v_old.frac, v_old.stamp,
			v_old.capacity, v_old.rate_tokens, v_old.period_us,
			p_cap, p_rate_tokens, p_period, p_n, p_per, p_conversion, v_now) AS a;
	END IF;
	o_allowed := v_tokens >= p_cost;
	o_remaining := v_tokens;
	IF v_small AND p_cost <= p_cap THEN
		-- {{.Wait}} in bigint: the stamp is at or after now, both at least 0.
		v_e := v_stamp - v_now;
		o_retry_us := CASE WHEN v_tokens >= p_cost THEN 0 WHEN p_n = 0 THEN -1
			ELSE ((p_cost - v_tokens) * p_per - v_frac + p_n - 1) / p_n END;
		o_retry_us := CASE WHEN o_retry_us <= 0 THEN o_retry_us WHEN o_retry_us > 9223372036854775 - v_e THEN -1 ELSE o_retry_us + v_e END;
		o_reset_us := CASE WHEN v_tokens >= p_cap THEN 0 WHEN p_n = 0 THEN -1
			ELSE ((p_cap - v_tokens) * p_per - v_frac + p_n - 1) / p_n END;
		o_reset_us := CASE WHEN o_reset_us <= 0 THEN o_reset_us WHEN o_reset_us > 9223372036854775 - v_e THEN -1 ELSE o_reset_us + v_e END;
	ELSE
		o_retry_us := {{.Wait}}(v_tokens, v_frac, p_cost, p_n, p_per, v_stamp, v_now);
		o_reset_us := {{.Wait}}(v_tokens, v_frac, p_cap, p_n, p_per, v_stamp, v_now);
	END IF;
END
$$;

-- Which of the functions of the operations beyond a take this migration
-- creates (rather than replaces), so that they can be given the privileges
-- of the take function below.
SELECT set_config('sluice_pgstore.created_ops',
	CASE WHEN to_regprocedure('{{.TakeAll}}(text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], bigint[], integer, boolean, bigint)') IS NULL THEN 'take_all ' ELSE '' END ||
	CASE WHEN to_regprocedure('{{.Refund}}(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint)') IS NULL THEN 'refund ' ELSE '' END ||
	CASE WHEN to_regprocedure('{{.Reset}}(text, bytea, bigint)') IS NULL THEN 'reset ' ELSE '' END,
	true);

-- {{.TakeAll}} decides several buckets together: the whole of
-- sluice.Operator.TakeAll, or, with p_drain, of Drain (one bucket), for
-- requests that passed validation in Go, in one statement at READ
-- COMMITTED. Part i is the bucket (p_policies[i], p_keys[i]), its cost
-- p_costs[i] and its request's limit p_caps[i], p_rate_tokens[i],
-- p_periods[i] (reduced to p_ns[i], p_pers[i]); no bucket is named twice.
--
-- The parts' rows are locked in the order of (policy, key), whatever the
-- order of the parts, so that two multi-takes that share buckets never
-- wait for each other in a cycle. Each row is locked as {{.Take}} locks
-- its one row: a free row at once, a row another transaction holds after
-- waiting for it (timed), and a missing bucket by inserting it, with the
-- level it has if its cost is taken. Once all are locked, every bucket is
-- brought up to date as a take of it would be (refilled under its own
-- limit, converted to the request's), and each cost is taken if every
-- bucket covers its own cost, and none otherwise; with p_drain, each
-- bucket gives the smaller of its cost and its whole tokens instead, and
-- a cost may exceed the capacity. Every bucket is written back as a take
-- of it alone would write it, also when nothing was taken: refilled,
-- converted, and created full (no earlier than the sweep floor, read after
-- the inserts, as in {{.Take}}) if it was missing.
--
-- Waits are measured from p_now as in {{.Take}}. o_allowed[i] reports
-- whether bucket i covered its cost (with p_drain: gave all of it),
-- o_retry_us[i] its own wait when not (-1: never; always so for a drain
-- larger than the capacity), o_remaining[i] and o_reset_us[i] its level
-- after the call, o_taken[i] what was taken from it. o_lock_wait_us is the
-- time waited for the rows' locks, in µs of clock_timestamp(), and
-- o_conversions the number of buckets converted to another limit.
CREATE OR REPLACE FUNCTION {{.TakeAll}}(
	p_policies text[], p_keys bytea[], p_costs bigint[],
	p_caps bigint[], p_rate_tokens bigint[], p_periods bigint[], p_ns bigint[], p_pers bigint[],
	p_conversion integer, p_drain boolean, p_now bigint,
	OUT o_allowed boolean[], OUT o_remaining bigint[], OUT o_retry_us bigint[], OUT o_reset_us bigint[],
	OUT o_taken bigint[], OUT o_lock_wait_us bigint, OUT o_conversions integer)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	v_now bigint := coalesce(p_now, {{.Clock}}());
	v_count integer := cardinality(p_policies);
	v_i integer;
	v_t0 timestamptz;
	v_old record;
	v_found boolean;
	v_held boolean;
	v_inserted boolean := false;
	v_all boolean := true;
	v_floor bigint;
	v_tokens bigint;
	v_frac bigint;
	v_stamp bigint;
	v_taken bigint;
	v_full_at bigint;
	-- Whether a part computes in bigint, as in {{.Take}}.
	v_small boolean;
	v_c bigint;
	v_e bigint;
	-- Per part: the level decided on (before any take), the level as the
	-- row holds it, whether the row was inserted here, and whether the
	-- bucket was converted.
	v_dt bigint[] := array_fill(0::bigint, ARRAY[v_count]);
	v_df bigint[] := array_fill(0::bigint, ARRAY[v_count]);
	v_ds bigint[] := array_fill(0::bigint, ARRAY[v_count]);
	v_rt bigint[] := array_fill(0::bigint, ARRAY[v_count]);
	v_rf bigint[] := array_fill(0::bigint, ARRAY[v_count]);
	v_rs bigint[] := array_fill(0::bigint, ARRAY[v_count]);
	v_new boolean[] := array_fill(false, ARRAY[v_count]);
	v_conv boolean[] := array_fill(false, ARRAY[v_count]);
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'sluice pgstore: a decision must run at READ COMMITTED, not %', current_setting('transaction_isolation')
			USING ERRCODE = 'invalid_transaction_state',
			HINT = 'Use sessions whose default_transaction_isolation is read committed (the default) for the store''s pool.';
	END IF;
	o_lock_wait_us := 0;
	o_conversions := 0;
	o_allowed := array_fill(false, ARRAY[v_count]);
	o_remaining := array_fill(0::bigint, ARRAY[v_count]);
	o_retry_us := array_fill(0::bigint, ARRAY[v_count]);
	o_reset_us := array_fill(0::bigint, ARRAY[v_count]);
	o_taken := array_fill(0::bigint, ARRAY[v_count]);

	FOR v_i IN SELECT i FROM generate_subscripts(p_policies, 1) AS i ORDER BY p_policies[i] COLLATE "C", p_keys[i] LOOP
		-- As in {{.Take}}, a bucket that SKIP LOCKED misses is inserted:
		-- a conflict tells a held row from a missing one.
		v_held := false;
		LOOP
			SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
			INTO v_old
			FROM {{.Buckets}} AS b WHERE b.policy = p_policies[v_i] AND b.key = p_keys[v_i] FOR UPDATE SKIP LOCKED;
			v_found := FOUND;
			-- (Two IFs: see {{.Take}}.)
			IF NOT v_found THEN
				IF v_held THEN
					-- The insert below conflicted: another transaction
					-- holds the bucket. Wait for it, and time the wait.
					v_t0 := clock_timestamp();
					SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
					INTO v_old
					FROM {{.Buckets}} AS b WHERE b.policy = p_policies[v_i] AND b.key = p_keys[v_i] FOR UPDATE;
					v_found := FOUND;
					o_lock_wait_us := o_lock_wait_us + greatest((extract(epoch FROM clock_timestamp() - v_t0) * 1000000)::bigint, 0);
				END IF;
			END IF;
			IF v_found THEN
				v_conv[v_i] := p_caps[v_i] <> v_old.capacity OR p_rate_tokens[v_i] <> v_old.rate_tokens OR p_periods[v_i] <> v_old.period_us;
				IF NOT v_conv[v_i] AND p_caps[v_i] <= 4611686018427387903 / p_pers[v_i] AND v_old.stamp >= 0 AND v_now >= 0 THEN
					-- {{.Advance}} under an unchanged limit, in bigint, as in {{.Take}}.
					v_tokens := v_old.tokens;
					v_frac := v_old.frac;
					v_stamp := v_old.stamp;
					IF v_now > v_stamp THEN
						IF p_ns[v_i] <> 0 AND v_tokens < p_caps[v_i] THEN
							v_e := v_now - v_stamp;
							IF v_e >= ((p_caps[v_i] - v_tokens) * p_pers[v_i] - v_frac + p_ns[v_i] - 1) / p_ns[v_i] THEN
								v_tokens := p_caps[v_i];
								v_frac := 0;
							ELSE
								v_e := v_e * p_ns[v_i] + v_frac;
								v_tokens := v_tokens + v_e / p_pers[v_i];
								v_frac := v_e % p_pers[v_i];
							END IF;
						END IF;
						v_stamp := v_now;
					END IF;
				ELSE
					SELECT a.o_tokens, a.o_frac, a.o_stamp INTO v_tokens, v_frac, v_stamp
					FROM {{.Advance}}(v_old.tokens, v_old.frac, v_old.stamp,
						v_old.capacity, v_old.rate_tokens, v_old.period_us,
						p_caps[v_i], p_rate_tokens[v_i], p_periods[v_i], p_ns[v_i], p_pers[v_i], p_conversion, v_now) AS a;
				END IF;
				v_dt[v_i] := v_tokens;
				v_df[v_i] := v_frac;
				v_ds[v_i] := v_stamp;
				v_rt[v_i] := v_old.tokens;
				v_rf[v_i] := v_old.frac;
				v_rs[v_i] := v_old.stamp;
				EXIT;
			END IF;
			-- 1. A missing bucket starts full, stamped now. It covers any
			-- cost of a take (cost <= capacity), so it is inserted as a
			-- take leaves it, which is the usual outcome; a denial writes
			-- it back full below.
			v_tokens := p_caps[v_i] - least(p_costs[v_i], p_caps[v_i]);
			IF p_ns[v_i] <> 0 AND p_caps[v_i] <= 4611686018427387903 / p_pers[v_i] THEN
				v_c := ((p_caps[v_i] - v_tokens) * p_pers[v_i] + p_ns[v_i] - 1) / p_ns[v_i];
				v_full_at := CASE WHEN v_now >= 9223372036854775807 - v_c THEN NULL ELSE v_now + v_c END;
			ELSE
				v_full_at := {{.FullAt}}(v_tokens, 0, v_now, p_caps[v_i], p_ns[v_i], p_pers[v_i]);
			END IF;
			v_t0 := clock_timestamp();
			INSERT INTO {{.Buckets}} AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at)
			VALUES (p_policies[v_i], p_keys[v_i], v_tokens, 0, v_now, p_caps[v_i], p_rate_tokens[v_i], p_periods[v_i], v_full_at)
			ON CONFLICT (policy, key) DO NOTHING;
			IF FOUND THEN
				v_dt[v_i] := p_caps[v_i];
				v_ds[v_i] := v_now;
				v_rt[v_i] := v_tokens;
				v_rs[v_i] := v_now;
				v_new[v_i] := true;
				v_inserted := true;
				EXIT;
			END IF;
			-- The bucket exists: another transaction holds it, or created
			-- it after the SELECT (the insert waited for it to end if it
			-- had changed the row: that is a wait for the lock too).
			o_lock_wait_us := o_lock_wait_us + greatest((extract(epoch FROM clock_timestamp() - v_t0) * 1000000)::bigint, 0);
			v_held := true;
		END LOOP;
	END LOOP;

	IF v_inserted THEN
		-- No bucket is created with a stamp before the sweep floor: see
		-- {{.Take}}. This statement's snapshot is taken after every insert
		-- above succeeded.
		SELECT f.floor_us INTO v_floor FROM {{.Floor}} AS f;
		IF v_floor > v_now THEN
			FOR v_i IN 1..v_count LOOP
				IF v_new[v_i] THEN
					v_ds[v_i] := v_floor;
				END IF;
			END LOOP;
		END IF;
	END IF;

	-- 4. Take every cost if every bucket covers its own: frac is less than
	-- one token and the costs are whole, so that is tokens >= cost.
	FOR v_i IN 1..v_count LOOP
		IF v_dt[v_i] < p_costs[v_i] THEN
			v_all := false;
		END IF;
	END LOOP;

	FOR v_i IN 1..v_count LOOP
		v_tokens := v_dt[v_i];
		v_frac := v_df[v_i];
		v_stamp := v_ds[v_i];
		IF p_drain THEN
			v_taken := least(p_costs[v_i], v_tokens);
			o_allowed[v_i] := v_taken = p_costs[v_i];
		ELSE
			o_allowed[v_i] := v_tokens >= p_costs[v_i];
			v_taken := CASE WHEN v_all THEN p_costs[v_i] ELSE 0 END;
		END IF;
		v_tokens := v_tokens - v_taken;
		o_taken[v_i] := v_taken;
		-- 5. The decision of each bucket, and when it is full again: in
		-- bigint as in {{.Take}} where the limit allows it and nothing was
		-- converted (the stamp is then at or after now, at least 0).
		v_small := NOT v_conv[v_i] AND p_caps[v_i] <= 4611686018427387903 / p_pers[v_i] AND v_now >= 0;
		v_e := CASE WHEN v_small THEN v_stamp - v_now END;
		IF o_allowed[v_i] THEN
			o_retry_us[v_i] := 0;
		ELSIF p_costs[v_i] > p_caps[v_i] THEN
			o_retry_us[v_i] := -1; -- a drain larger than the bucket: no wait covers it
		ELSIF NOT v_small THEN
			o_retry_us[v_i] := {{.Wait}}(v_tokens, v_frac, p_costs[v_i], p_ns[v_i], p_pers[v_i], v_stamp, v_now);
		ELSIF p_ns[v_i] = 0 THEN
			o_retry_us[v_i] := -1;
		ELSE
			v_c := ((p_costs[v_i] - v_tokens) * p_pers[v_i] - v_frac + p_ns[v_i] - 1) / p_ns[v_i];
			o_retry_us[v_i] := CASE WHEN v_c > 9223372036854775 - v_e THEN -1 ELSE v_c + v_e END;
		END IF;
		o_remaining[v_i] := v_tokens;
		IF NOT v_small THEN
			o_reset_us[v_i] := {{.Wait}}(v_tokens, v_frac, p_caps[v_i], p_ns[v_i], p_pers[v_i], v_stamp, v_now);
			v_full_at := {{.FullAt}}(v_tokens, v_frac, v_stamp, p_caps[v_i], p_ns[v_i], p_pers[v_i]);
		ELSIF v_tokens >= p_caps[v_i] THEN
			o_reset_us[v_i] := 0;
			v_full_at := v_stamp;
		ELSIF p_ns[v_i] = 0 THEN
			o_reset_us[v_i] := -1;
			v_full_at := NULL;
		ELSE
			v_c := ((p_caps[v_i] - v_tokens) * p_pers[v_i] - v_frac + p_ns[v_i] - 1) / p_ns[v_i];
			o_reset_us[v_i] := CASE WHEN v_c > 9223372036854775 - v_e THEN -1 ELSE v_c + v_e END;
			v_full_at := CASE WHEN v_stamp >= 9223372036854775807 - v_c THEN NULL ELSE v_stamp + v_c END;
		END IF;
		IF v_tokens <> v_rt[v_i] OR v_frac <> v_rf[v_i] OR v_stamp <> v_rs[v_i] OR v_conv[v_i] THEN
			UPDATE {{.Buckets}} SET
				tokens = v_tokens, frac = v_frac, stamp = v_stamp,
				capacity = p_caps[v_i], rate_tokens = p_rate_tokens[v_i], period_us = p_periods[v_i],
				full_at = v_full_at
			WHERE policy = p_policies[v_i] AND key = p_keys[v_i];
		END IF;
		IF v_conv[v_i] THEN
			o_conversions := o_conversions + 1;
		END IF;
	END LOOP;
END
$$;

-- {{.Refund}} gives p_cost tokens back to the bucket of (p_policy, p_key),
-- never above the capacity: the whole of sluice.Operator.Refund for a
-- request that passed validation in Go, in one statement at READ
-- COMMITTED. The bucket is locked as in {{.Take}} and brought up to date
-- (refilled, converted); its whole tokens t rise by
-- a = min(p_cost, capacity - t), and a level that reaches the capacity is
-- exactly full (its fraction dropped). A bucket that is full at now is
-- left as it is, unwritten, as a missing one is (which is not created).
--
-- With p_request_id, the refund undoes the allowed take remembered for it
-- (expires_at > now), at most once: o_status 3 if there is none, 2 if
-- p_cost exceeds its cost or the limit is not its limit (o_cost and the o_
-- limit columns are then the remembered ones; else they are 0), and
-- nothing is changed either way; 1 if the record is marked refunded already, which is a
-- replay that changes nothing; else 0, and the record is marked. The
-- record's row is locked, and for a missing bucket a row is inserted (and
-- deleted again before the statement ends) to hold the bucket's lock, so
-- that a take that creates the bucket and reuses the ID waits for the
-- refund rather than have it undo the new take without giving its tokens
-- back.
--
-- o_remaining and o_reset_us report the level after the refund, waits
-- measured from p_now as in {{.Take}}; o_added is a.
CREATE OR REPLACE FUNCTION {{.Refund}}(
	p_policy text, p_key bytea, p_cost bigint,
	p_cap bigint, p_rate_tokens bigint, p_period bigint, p_n bigint, p_per bigint,
	p_conversion integer, p_request_id bytea, p_now bigint,
	OUT o_status integer, OUT o_remaining bigint, OUT o_reset_us bigint, OUT o_added bigint,
	OUT o_cost bigint, OUT o_capacity bigint, OUT o_rate_tokens bigint, OUT o_period_us bigint,
	OUT o_lock_wait_us bigint, OUT o_converted boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	v_now bigint := coalesce(p_now, {{.Clock}}());
	v_t0 timestamptz;
	v_old record;
	v_id record;
	v_found boolean;
	v_placeholder boolean := false;
	v_tokens bigint := p_cap;
	v_frac bigint := 0;
	v_stamp bigint := v_now;
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'sluice pgstore: a decision must run at READ COMMITTED, not %', current_setting('transaction_isolation')
			USING ERRCODE = 'invalid_transaction_state',
			HINT = 'Use sessions whose default_transaction_isolation is read committed (the default) for the store''s pool.';
	END IF;
	o_status := 0;
	o_remaining := 0;
	o_reset_us := 0;
	o_added := 0;
	o_cost := 0;
	o_capacity := 0;
	o_rate_tokens := 0;
	o_period_us := 0;
	o_lock_wait_us := 0;
	o_converted := false;
	LOOP
		SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
		INTO v_old
		FROM {{.Buckets}} AS b WHERE b.policy = p_policy AND b.key = p_key FOR UPDATE SKIP LOCKED;
		v_found := FOUND;
		IF NOT v_found THEN
			IF EXISTS (SELECT FROM {{.Buckets}} AS b WHERE b.policy = p_policy AND b.key = p_key) THEN
				v_t0 := clock_timestamp();
				SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
				INTO v_old
				FROM {{.Buckets}} AS b WHERE b.policy = p_policy AND b.key = p_key FOR UPDATE;
				v_found := FOUND;
				o_lock_wait_us := o_lock_wait_us + greatest((extract(epoch FROM clock_timestamp() - v_t0) * 1000000)::bigint, 0);
			END IF;
		END IF;
		EXIT WHEN v_found OR p_request_id IS NULL;
		-- A missing bucket and a request ID: hold the bucket's lock with a
		-- row of the full bucket, deleted below.
		v_t0 := clock_timestamp();
		INSERT INTO {{.Buckets}} AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at)
		VALUES (p_policy, p_key, p_cap, 0, v_now, p_cap, p_rate_tokens, p_period, v_now)
		ON CONFLICT (policy, key) DO NOTHING;
		IF FOUND THEN
			v_placeholder := true;
			EXIT;
		END IF;
		o_lock_wait_us := o_lock_wait_us + greatest((extract(epoch FROM clock_timestamp() - v_t0) * 1000000)::bigint, 0);
	END LOOP;

	IF p_request_id IS NOT NULL THEN
		SELECT r.cost, r.capacity, r.rate_tokens, r.period_us, r.refunded INTO v_id
		FROM {{.RequestIDs}} AS r
		WHERE r.policy = p_policy AND r.key = p_key AND r.request_id = p_request_id AND r.expires_at > v_now
		FOR UPDATE;
		IF NOT FOUND THEN
			o_status := 3;
		ELSE
			o_cost := v_id.cost;
			o_capacity := v_id.capacity;
			o_rate_tokens := v_id.rate_tokens;
			o_period_us := v_id.period_us;
			IF v_id.capacity <> p_cap OR v_id.rate_tokens <> p_rate_tokens OR v_id.period_us <> p_period OR p_cost > v_id.cost THEN
				o_status := 2;
			ELSIF v_id.refunded THEN
				o_status := 1;
			ELSE
				UPDATE {{.RequestIDs}} SET refunded = true
				WHERE policy = p_policy AND key = p_key AND request_id = p_request_id;
			END IF;
		END IF;
	END IF;
	IF v_placeholder THEN
		DELETE FROM {{.Buckets}} WHERE policy = p_policy AND key = p_key;
	END IF;
	IF o_status >= 2 THEN
		RETURN;
	END IF;

	IF v_found THEN
		SELECT a.o_tokens, a.o_frac, a.o_stamp INTO v_tokens, v_frac, v_stamp
		FROM {{.Advance}}(v_old.tokens, v_old.frac, v_old.stamp,
			v_old.capacity, v_old.rate_tokens, v_old.period_us,
			p_cap, p_rate_tokens, p_period, p_n, p_per, p_conversion, v_now) AS a;
		-- A bucket that is full at now is left as it is (as a missing one
		-- is): nothing written, not even the refill.
		IF o_status = 0 AND v_tokens < p_cap THEN
			o_converted := p_cap <> v_old.capacity OR p_rate_tokens <> v_old.rate_tokens OR p_period <> v_old.period_us;
			o_added := least(p_cost, p_cap - v_tokens);
			v_tokens := v_tokens + o_added;
			IF v_tokens = p_cap THEN
				v_frac := 0;
			END IF;
			UPDATE {{.Buckets}} SET
				tokens = v_tokens, frac = v_frac, stamp = v_stamp,
				capacity = p_cap, rate_tokens = p_rate_tokens, period_us = p_period,
				full_at = {{.FullAt}}(v_tokens, v_frac, v_stamp, p_cap, p_n, p_per)
			WHERE policy = p_policy AND key = p_key;
		END IF;
	END IF;
	o_remaining := v_tokens;
	o_reset_us := {{.Wait}}(v_tokens, v_frac, p_cap, p_n, p_per, v_stamp, v_now);
END
$$;

-- {{.Reset}} makes the bucket of (p_policy, p_key) full under the limit it
-- was last decided under, stamped at p_now or at its stamp if that is
-- later (time never runs backwards inside a bucket), unless it is full at
-- that time already: the whole of sluice.Operator.Reset, one statement at
-- READ COMMITTED that waits for the row's lock. The row is kept rather
-- than deleted: a later decision whose time is before the stamp still
-- refills from the stamp, and the sweeper deletes the bucket, full, like
-- any other. A bucket that is full, or missing, is left as it is; request
-- IDs are kept. o_reset reports whether the bucket was written.
CREATE OR REPLACE FUNCTION {{.Reset}}(p_policy text, p_key bytea, p_now bigint, OUT o_reset boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	v_now bigint := coalesce(p_now, {{.Clock}}());
	v_old record;
	v_g bigint;
	v_tokens bigint;
	v_stamp bigint;
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'sluice pgstore: a decision must run at READ COMMITTED, not %', current_setting('transaction_isolation')
			USING ERRCODE = 'invalid_transaction_state',
			HINT = 'Use sessions whose default_transaction_isolation is read committed (the default) for the store''s pool.';
	END IF;
	o_reset := false;
	SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
	INTO v_old
	FROM {{.Buckets}} AS b WHERE b.policy = p_policy AND b.key = p_key FOR UPDATE;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	-- Refilled under its own limit (gcd(0, P) = P: n' = 0, p' = 1).
	v_g := gcd(v_old.rate_tokens, v_old.period_us);
	SELECT a.o_tokens, a.o_stamp INTO v_tokens, v_stamp
	FROM {{.Advance}}(v_old.tokens, v_old.frac, v_old.stamp,
		v_old.capacity, v_old.rate_tokens, v_old.period_us,
		v_old.capacity, v_old.rate_tokens, v_old.period_us, v_old.rate_tokens / v_g, v_old.period_us / v_g, 0, v_now) AS a;
	IF v_tokens >= v_old.capacity THEN
		RETURN;
	END IF;
	UPDATE {{.Buckets}} SET tokens = capacity, frac = 0, stamp = v_stamp, full_at = v_stamp
	WHERE policy = p_policy AND key = p_key;
	o_reset := true;
END
$$;

-- The functions of schema versions 1 and 2, kept for their processes while
-- a deployment rolls over: they decide under the policy '' (where an
-- upgrade keeps those versions' rows) with this version's functions, and
-- return what they returned. Version 1's take had no o_lock_wait_us, and
-- CREATE OR REPLACE cannot change a function's result type: drop that one
-- first, keeping the privileges granted on it (stashed in a setting local
-- to the migration's transaction, and granted again below).
DO $$
DECLARE
	v_acl aclitem[];
BEGIN
	SELECT p.proacl INTO v_acl FROM pg_proc AS p
	WHERE p.oid = to_regprocedure('{{.Take}}(bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)')
		AND NOT 'o_lock_wait_us' = ANY (p.proargnames);
	IF FOUND THEN
		PERFORM set_config('sluice_pgstore.take_acl', coalesce(v_acl::text, 'default'), true);
		DROP FUNCTION {{.Take}}(bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint);
	END IF;
END
$$;

CREATE OR REPLACE FUNCTION {{.Take}}(
	p_key bytea, p_cost bigint,
	p_cap bigint, p_rate_tokens bigint, p_period bigint, p_n bigint, p_per bigint,
	p_policy integer, p_request_id bytea, p_ttl bigint, p_now bigint,
	OUT o_status integer, OUT o_allowed boolean, OUT o_remaining bigint,
	OUT o_retry_us bigint, OUT o_reset_us bigint,
	OUT o_cost bigint, OUT o_capacity bigint, OUT o_rate_tokens bigint, OUT o_period_us bigint,
	OUT o_lock_wait_us bigint)
LANGUAGE sql VOLATILE AS $$
	SELECT t.o_status, t.o_allowed, t.o_remaining, t.o_retry_us, t.o_reset_us,
		t.o_cost, t.o_capacity, t.o_rate_tokens, t.o_period_us, t.o_lock_wait_us
	FROM {{.Take}}(''::text, p_key, p_cost, p_cap, p_rate_tokens, p_period, p_n, p_per,
		p_policy, p_request_id, p_ttl, p_now) AS t
$$;

CREATE OR REPLACE FUNCTION {{.Peek}}(
	p_key bytea,
	p_cap bigint, p_rate_tokens bigint, p_period bigint, p_n bigint, p_per bigint,
	p_policy integer, p_now bigint,
	OUT o_allowed boolean, OUT o_remaining bigint, OUT o_retry_us bigint, OUT o_reset_us bigint)
LANGUAGE sql VOLATILE AS $$
	SELECT p.o_allowed, p.o_remaining, p.o_retry_us, p.o_reset_us
	FROM {{.Peek}}(''::text, p_key, 1, p_cap, p_rate_tokens, p_period, p_n, p_per, p_policy, p_now) AS p
$$;

-- Privileges: if the DO block above dropped version 1's take function,
-- grant its privileges on the wrapper that replaced it. Then give this
-- version's take and peek functions, if this migration created them, the
-- privileges of those of version 1 or 2 (a role that may only decide keeps
-- deciding; PUBLIC's privilege is kept or revoked as it was).
DO $$
DECLARE
	v_acl text := current_setting('sluice_pgstore.take_acl', true);
	v_created text := current_setting('sluice_pgstore.created', true);
	v_fn record;
	v_grant record;
BEGIN
	FOR v_fn IN VALUES
		('take', '{{.Take}}(bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)'::regprocedure,
			'{{.Take}}(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)'::regprocedure),
		('peek', '{{.Peek}}(bytea, bigint, bigint, bigint, bigint, bigint, integer, bigint)'::regprocedure,
			'{{.Peek}}(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bigint)'::regprocedure)
	LOOP
		IF v_fn.column1 = 'take' AND coalesce(v_acl, '') NOT IN ('', 'default') THEN
			EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_fn.column2);
			FOR v_grant IN
				SELECT a.grantee, a.is_grantable FROM aclexplode(v_acl::aclitem[]) AS a
				WHERE a.privilege_type = 'EXECUTE'
			LOOP
				EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', v_fn.column2,
					CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(v_grant.grantee)) END,
					CASE WHEN v_grant.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
			END LOOP;
		END IF;
		CONTINUE WHEN position(v_fn.column1 IN coalesce(v_created, '')) = 0;
		CONTINUE WHEN (SELECT proacl FROM pg_proc WHERE oid = v_fn.column2) IS NULL; -- the default, as the new one has
		EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_fn.column3);
		FOR v_grant IN
			SELECT a.grantee, a.is_grantable FROM pg_proc AS p, aclexplode(p.proacl) AS a
			WHERE p.oid = v_fn.column2 AND a.privilege_type = 'EXECUTE'
		LOOP
			EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', v_fn.column3,
				CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(v_grant.grantee)) END,
				CASE WHEN v_grant.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
		END LOOP;
	END LOOP;
	PERFORM set_config('sluice_pgstore.take_acl', '', true);
	PERFORM set_config('sluice_pgstore.created', '', true);
END
$$;

-- The functions of the operations beyond a take that this migration
-- created (an upgrade from version 3 or older) get the EXECUTE privileges
-- of the take function, as it has them now, so that a role allowed to
-- decide can use every operation (PUBLIC's privilege is kept or revoked
-- as it is on the take function). A take function with the default
-- privileges leaves them at the default too.
DO $$
DECLARE
	v_created text := current_setting('sluice_pgstore.created_ops', true);
	v_take regprocedure := '{{.Take}}(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint, bigint)'::regprocedure;
	v_fn record;
	v_grant record;
BEGIN
	IF (SELECT proacl FROM pg_proc WHERE oid = v_take) IS NOT NULL THEN
		FOR v_fn IN VALUES
			('take_all', '{{.TakeAll}}(text[], bytea[], bigint[], bigint[], bigint[], bigint[], bigint[], bigint[], integer, boolean, bigint)'::regprocedure),
			('refund', '{{.Refund}}(text, bytea, bigint, bigint, bigint, bigint, bigint, bigint, integer, bytea, bigint)'::regprocedure),
			('reset', '{{.Reset}}(text, bytea, bigint)'::regprocedure)
		LOOP
			CONTINUE WHEN position(v_fn.column1 || ' ' IN coalesce(v_created, '')) = 0;
			EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_fn.column2);
			FOR v_grant IN
				SELECT a.grantee, a.is_grantable FROM pg_proc AS p, aclexplode(p.proacl) AS a
				WHERE p.oid = v_take AND a.privilege_type = 'EXECUTE'
			LOOP
				EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', v_fn.column2,
					CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(v_grant.grantee)) END,
					CASE WHEN v_grant.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
			END LOOP;
		END LOOP;
	END IF;
	PERFORM set_config('sluice_pgstore.created_ops', '', true);
END
$$;

-- {{.Sweep}} deletes at most p_limit full buckets (full_at <= now) and at most
-- p_limit expired request IDs (expires_at <= now), in one transaction, and
-- raises the sweep floor to now. Rows locked by a decision in progress are
-- skipped, not waited for; the condition is checked again on the row
-- version being deleted. A full bucket is the same as a missing one, so
-- deleting it changes no decision made at now or later; and no bucket is
-- created again before now (the floor), so none made earlier changes
-- either.
--
-- The transaction commits without waiting for its WAL to reach the disk
-- (synchronous_commit = off, for this transaction only): a crash may bring
-- back the rows of its last sweeps, full buckets and expired request IDs,
-- which decide exactly as missing ones, with the floor as it was, and the
-- next sweep deletes them again. WAL is written in order, so a decision
-- committed after the sweep makes the sweep durable too. A sweep's commit
-- then neither waits for nor asks for a WAL flush of its own.
CREATE OR REPLACE FUNCTION {{.Sweep}}(p_now bigint, p_limit integer,
	OUT o_buckets bigint, OUT o_request_ids bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	v_now bigint := coalesce(p_now, {{.Clock}}());
BEGIN
	PERFORM set_config('synchronous_commit', 'off', true);
	DELETE FROM {{.Buckets}}
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {{.Buckets}} WHERE sweep_at <= (v_now >> 23) AND full_at <= v_now
		LIMIT p_limit FOR UPDATE SKIP LOCKED))
	AND full_at <= v_now;
	GET DIAGNOSTICS o_buckets = ROW_COUNT;

	DELETE FROM {{.RequestIDs}}
	WHERE ctid = ANY (ARRAY(
		SELECT ctid FROM {{.RequestIDs}} WHERE expires_at <= v_now
		LIMIT p_limit FOR UPDATE SKIP LOCKED))
	AND expires_at <= v_now;
	GET DIAGNOSTICS o_request_ids = ROW_COUNT;

	UPDATE {{.Floor}} SET floor_us = v_now WHERE floor_us < v_now;
END
$$;
