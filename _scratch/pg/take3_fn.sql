CREATE OR REPLACE FUNCTION px.t_take3(p_policy text, p_key bytea, p_cost bigint, p_cap bigint, p_rate_tokens bigint, p_period bigint, p_n bigint, p_per bigint, p_conversion integer, p_request_id bytea, p_ttl bigint, p_now bigint, OUT o_status integer, OUT o_allowed boolean, OUT o_remaining bigint, OUT o_retry_us bigint, OUT o_reset_us bigint, OUT o_cost bigint, OUT o_capacity bigint, OUT o_rate_tokens bigint, OUT o_period_us bigint, OUT o_lock_wait_us bigint, OUT o_converted boolean)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
	v_now bigint := coalesce(p_now, "px"."t_clock"());
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
		FROM "px"."t" AS b WHERE b.policy = p_policy AND b.key = p_key FOR UPDATE SKIP LOCKED;
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
				v_full_at := "px"."t_full_at"(v_tokens, v_frac, v_stamp, p_cap, p_n, p_per);
				o_reset_us := "px"."t_wait"(v_tokens, v_frac, p_cap, p_n, p_per, v_stamp, v_now);
			END IF;

			v_t0 := clock_timestamp();
			SELECT b.tokens, b.frac, b.stamp, b.capacity, b.rate_tokens, b.period_us
			INTO v_old
			FROM "px"."t" AS b WHERE b.policy = p_policy AND b.key = p_key FOR UPDATE;
			IF FOUND THEN
				o_lock_wait_us := o_lock_wait_us + greatest((extract(epoch FROM clock_timestamp() - v_t0) * 1000000)::bigint, 0);
			ELSE
			INSERT INTO "px"."t" AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at)
			VALUES (p_policy, p_key, v_tokens, v_frac, v_stamp, p_cap, p_rate_tokens, p_period, v_full_at)
			ON CONFLICT (policy, key) DO NOTHING;
			IF FOUND THEN
				IF p_request_id IS NOT NULL THEN
					-- The bucket may have been swept (full) after an earlier
					-- decision of this request ID: replay that one and leave
					-- the bucket missing, as it was.
					SELECT r.* INTO v_id FROM "px"."t_request_ids" AS r
					WHERE r.policy = p_policy AND r.key = p_key AND r.request_id = p_request_id AND r.expires_at > v_now;
					IF FOUND THEN
						DELETE FROM "px"."t" WHERE policy = p_policy AND key = p_key;
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
				SELECT f.floor_us INTO v_floor FROM "px"."t_floor" AS f;
				IF v_floor > v_stamp THEN
					v_stamp := v_floor;
					o_reset_us := "px"."t_wait"(v_tokens, v_frac, p_cap, p_n, p_per, v_stamp, v_now);
					v_full_at := "px"."t_full_at"(v_tokens, v_frac, v_stamp, p_cap, p_n, p_per);
					UPDATE "px"."t" SET stamp = v_stamp, full_at = v_full_at
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
			FROM "px"."t" AS b WHERE b.policy = p_policy AND b.key = p_key FOR UPDATE;
			v_found := FOUND;
			o_lock_wait_us := o_lock_wait_us + greatest((extract(epoch FROM clock_timestamp() - v_t0) * 1000000)::bigint, 0);
			-- Deleted (by a sweep) while this waited: create it again.
			CONTINUE WHEN NOT v_found;
			END IF;
		END IF;

		IF p_request_id IS NOT NULL THEN
			SELECT r.* INTO v_id FROM "px"."t_request_ids" AS r
			WHERE r.policy = p_policy AND r.key = p_key AND r.request_id = p_request_id AND r.expires_at > v_now;
			IF FOUND THEN
				v_replay := true;
				EXIT;
			END IF;
		END IF;

		o_converted := p_cap <> v_old.capacity OR p_rate_tokens <> v_old.rate_tokens OR p_period <> v_old.period_us;
		IF o_converted THEN
			SELECT a.o_tokens, a.o_frac, a.o_stamp INTO v_tokens, v_frac, v_stamp
			FROM "px"."t_advance"(v_old.tokens, v_old.frac, v_old.stamp,
				v_old.capacity, v_old.rate_tokens, v_old.period_us,
				p_cap, p_rate_tokens, p_period, p_n, p_per, p_conversion, v_now) AS a;
		ELSIF v_small AND v_old.stamp >= 0 AND v_now >= 0 THEN
			-- "px"."t_advance" under an unchanged limit, in bigint: the elapsed
			-- µs e fill the deficit D when e >= ceil(D / n'); otherwise
			-- e * n' < D, and e * n' + frac < (C - tokens) * p'. The same
			-- statements refill in "px"."t_take_all" and "px"."t_peek": written as
			-- inlined SQL functions (like "px"."t_refill_tokens"), whose
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
			v_tokens := "px"."t_refill_tokens"(v_old.tokens, v_old.frac, v_old.stamp, p_cap, p_n, p_per, v_now);
			v_frac := "px"."t_refill_frac"(v_old.tokens, v_old.frac, v_old.stamp, p_cap, p_n, p_per, v_now);
			v_stamp := greatest(v_old.stamp, v_now);
		END IF;

		-- 4. Take the cost if the level covers it: frac is less than one
		-- token and the cost is whole, so that is tokens >= cost.
		o_allowed := v_tokens >= p_cost;
		IF o_allowed THEN
			v_tokens := v_tokens - p_cost;
			o_retry_us := 0;
		END IF;
		-- 5. The decision, and when the bucket is full again: "px"."t_wait"
		-- and "px"."t_full_at", in bigint when the refill was. There the
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
				o_retry_us := "px"."t_wait"(v_tokens, v_frac, p_cost, p_n, p_per, v_stamp, v_now);
			END IF;
			o_reset_us := "px"."t_wait"(v_tokens, v_frac, p_cap, p_n, p_per, v_stamp, v_now);
			v_full_at := "px"."t_full_at"(v_tokens, v_frac, v_stamp, p_cap, p_n, p_per);
		END IF;
		IF v_tokens <> v_old.tokens OR v_frac <> v_old.frac OR v_stamp <> v_old.stamp OR o_converted THEN
			UPDATE "px"."t" SET
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
		INSERT INTO "px"."t_request_ids" AS r (policy, key, request_id, cost, capacity, rate_tokens, period_us,
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
$function$

