// Package pgstore is a sluice.Store in PostgreSQL, for deployments that
// already run PostgreSQL and want quotas shared by many processes and kept
// across restarts.
//
// Every decision runs in a transaction at READ COMMITTED: its own, or one
// shared with concurrent takes (below). Its work is done by
// a PL/pgSQL function, called in one statement, that locks the bucket's
// row, refills it, converts it to a changed limit, decides, records the
// request ID of an allowed decision and keeps the expiry column up to date,
// all in that transaction and one round trip. There is no read in one
// transaction and write in another, and no retry loop on serialization
// failures. While most takes create their bucket, a take with no request
// ID first tries two plain statements in one transaction and round trip
// instead, an insert of the new bucket and its check against the sweep
// floor, which PostgreSQL runs faster than the function; a take that finds
// its bucket there writes nothing and is decided by the function, in a
// transaction and round trip of its own (Stats.InsertFirst,
// docs/postgres.md). Concurrent takes share transactions: while
// Options.Transactions takes are in flight, later ones queue and are sent
// together, one function call each in the order of (policy, key), in one
// round trip and one commit, each decided as if alone and in turn
// (Options.Batch). The arithmetic is bucket.Plan's at a tick
// of one microsecond, in bigint and numeric (arbitrary precision), so
// decisions equal the in-memory store's exactly for limits whose period is a
// whole number of microseconds (CheckLimit).
//
// The store is a sluice.Operator too, each operation one statement in the
// same way: TakeAll decides up to sluice.MaxParts buckets all or nothing,
// locking their rows in the order of (policy, key) so that multi-takes
// never deadlock; Drain, Refund (which marks the request ID it undoes, so
// that it undoes it once) and Reset each decide one bucket.
//
// A bucket is the row of (policy, key): the policy name and the key are the
// two columns of the primary key, so two policies never share a bucket or a
// request ID, and the key is stored as the caller gave it.
//
// Time is the database's clock (clock_timestamp(), read once per statement)
// unless Options.Now supplies it, so processes with skewed clocks agree. Full
// buckets and expired request IDs are deleted in bounded batches by a
// sweeper goroutine that Close stops; it pauses between batches
// (Options.SweepPauseRatio) so as to leave the database to the decisions.
// A sweep also raises a floor, its time, before which no bucket is created
// again, so that deleting a full bucket never gives tokens back to a take
// whose time was read before the sweep. The decision function also reports
// how long it waited for the bucket's row lock, which Stats adds up, with
// the decisions that gave up at the lock timeout and those that converted
// a bucket to another limit, for metrics.
//
// The schema ships with the package and is applied by Migrate, never at
// import or by New. It needs PostgreSQL 14 or later. A store whose schema
// is missing or older than SchemaVersion returns errors wrapping
// sluice.ErrMisconfigured that say to run Migrate; a database that cannot
// answer, errors wrapping sluice.ErrUnavailable. See docs/postgres.md.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// Defaults for the zero Options.
const (
	DefaultSchema           = "public"
	DefaultTable            = "sluice_buckets"
	DefaultRequestIDTTL     = 5 * time.Minute
	DefaultStatementTimeout = 200 * time.Millisecond
	DefaultLockTimeout      = 100 * time.Millisecond
	DefaultSweepInterval    = 10 * time.Second
	DefaultSweepBatch       = 1000
	DefaultSweepPauseRatio  = 9.0
	DefaultBatch            = 64
	DefaultTransactions     = 2
)

// Bounds on Options.
const (
	// MaxTimeout is the longest StatementTimeout and LockTimeout:
	// PostgreSQL's limit for both settings (2^31-1 ms, about 24.8 days).
	MaxTimeout = math.MaxInt32 * time.Millisecond
	// MaxSweepBatch is the largest SweepBatch.
	MaxSweepBatch = 1 << 30
	// MaxBatch is the largest Batch.
	MaxBatch = 1000
)

// maxSweepPause bounds one pause of a sweep between two batches.
const maxSweepPause = time.Minute

// Options configure a Store. The zero value of every field means its
// documented default; New refuses a value out of range with an error
// wrapping sluice.ErrInvalidOption and repairs none.
type Options struct {
	// Schema is the PostgreSQL schema holding the store's tables and
	// functions. Default DefaultSchema ("public"). It must be a plain
	// identifier (an ASCII letter or _, then letters, digits or _) of at
	// most MaxSchemaLen bytes; it is quoted, so its case is kept.
	Schema string
	// Table is the name of the bucket table. Default DefaultTable
	// ("sluice_buckets"). The request-ID table is Table + "_request_ids",
	// and the functions and indexes are named after Table too. A plain
	// identifier of at most MaxTableLen bytes, quoted. Stores with the
	// same Schema and Table share their buckets.
	Table string
	// OnLimitChange converts a bucket's level when a request of its policy
	// arrives with a limit other than the one it was last decided under.
	// Default sluice.KeepTokens. Processes sharing a table should agree on
	// it. Stats counts the conversions.
	OnLimitChange sluice.Conversion
	// RequestIDTTL is how long the first allowed decision of a request ID
	// is remembered, rounded up to whole microseconds. Default
	// DefaultRequestIDTTL (5 minutes); it must not be negative.
	RequestIDTTL time.Duration
	// Now, if not nil, is the clock: its readings are sent with each
	// statement, in whole microseconds since the Unix epoch. Default nil:
	// the database clock, clock_timestamp(), read once per statement,
	// which all processes share. A clock that steps back refills nothing
	// and never moves a bucket's stamp back. Setting Now is meant for tests
	// and simulations; processes with skewed clocks would disagree.
	Now func() time.Time
	// StatementTimeout bounds each statement on the server
	// (statement_timeout, set for the statement's transaction only, in
	// whole milliseconds rounded up; or carried by the pool's sessions,
	// see SessionTimeouts). Default DefaultStatementTimeout
	// (200ms); negative leaves the session's setting alone; at most
	// MaxTimeout. Use the context for a deadline on the whole call,
	// network included.
	StatementTimeout time.Duration
	// LockTimeout bounds the wait for a bucket's row lock (lock_timeout,
	// set like StatementTimeout), so that a hot key fails fast instead of
	// queueing. Default DefaultLockTimeout (100ms); negative leaves the
	// session's setting alone; at most MaxTimeout. Stats counts the
	// decisions that waited and those that gave up.
	LockTimeout time.Duration
	// SweepInterval is how often a background goroutine deletes full
	// buckets and expired request IDs. Default DefaultSweepInterval (10s);
	// negative disables it (call Sweep yourself, or let the table grow).
	// Close stops it.
	SweepInterval time.Duration
	// SweepBatch is the most rows of each table one sweep statement
	// deletes; a sweep runs statements until a batch comes back short.
	// A decision on a bucket that a statement is deleting waits for that
	// statement's commit, so keep a batch's time well below LockTimeout.
	// Smaller batches lock fewer rows at a time but each costs a
	// statement: with 250 rows, a paced sweep of 200,000 full buckets took
	// about three times as long as with 1,000 (docs/postgres.md).
	// Default DefaultSweepBatch (1,000); at most MaxSweepBatch, and not
	// negative.
	SweepBatch int
	// SweepPauseRatio paces sweeps so that they leave the database to the
	// decisions: after each batch that came back full, a sweep pauses for
	// SweepPauseRatio times as long as that batch's statement took (at
	// most a minute) before it runs the next one. A sweep then keeps its
	// connection busy at most 1/(1+SweepPauseRatio) of the time, and backs
	// off by itself when the database is slow; a sweep that fits in one
	// batch does not pause. It applies to the background sweeper and to
	// Sweep called directly. Default DefaultSweepPauseRatio (9: busy at
	// most a tenth of the time; in BenchmarkTakeDuringSweep decisions
	// then lost about a tenth of their rate while a large backlog was
	// swept, against a fifth to a third unpaced); negative: no pause, the
	// fastest sweep. NaN and +Inf are refused.
	SweepPauseRatio float64
	// Batch is the most takes one transaction decides. While
	// Transactions takes are in flight, later Takes queue, and the first
	// transaction to come back sends up to Batch of them as one: one round
	// trip, one take function call each, one commit, so that concurrent
	// takes share the commit's WAL flush, and the takes of a hot key its
	// row lock (docs/postgres.md, "Takes in shared transactions"). Every
	// decision is still the one the takes would get one after another. A
	// take that finds fewer than Transactions in flight is sent at once,
	// alone; a queued take whose context ends is withdrawn unsent. Only
	// Take is batched. Default DefaultBatch (64); 1: no batching, every
	// take its own transaction; at most MaxBatch; negative is an error.
	Batch int
	// Transactions is the most takes in flight at once before later ones
	// queue for a shared transaction (see Batch). Default
	// DefaultTransactions (2); negative is an error; without batching
	// (Batch 1) it has no effect. Give the pool at least this many
	// connections besides those of other work.
	Transactions int
}

// Store is a sluice.Store in PostgreSQL. It is safe for concurrent use, and
// any number of processes may share its tables. Create one with New, apply
// the schema with Migrate, and stop its sweeper with Close.
type Store struct {
	pool      *pgxpool.Pool
	schema    string
	names     names
	migration string
	queries
	prelude  string           // sets the timeouts for one transaction; "" if none
	timeouts []any            // the prelude's arguments
	session  []sessionTimeout // the timeouts the pool's sessions carry instead
	lift     string           // lifts those for one transaction; "" if none
	conv     int32            // Options.OnLimitChange
	idTTL    int64            // µs
	now      func() time.Time
	batch    int32
	pause    float64 // the SweepPauseRatio; 0: none

	// ready is set once the schema was found to be of SchemaVersion or
	// later (checkSchema), current if it was of SchemaVersion itself.
	ready, current atomic.Bool

	sweptBuckets, sweptIDs, sweepErrors     atomic.Uint64
	lastSweepErr                            atomic.Pointer[error]
	lockWaits, lockWaitMicros, lockTimeouts atomic.Uint64
	conversions                             atomic.Uint64
	insertFirstScore
	batcher *batcher // nil without batching

	cancelSweeper context.CancelFunc
	done          chan struct{}
	closeOnce     sync.Once
}

var (
	_ sluice.Store        = (*Store)(nil)
	_ sluice.Operator     = (*Store)(nil)
	_ sluice.LimitChecker = (*Store)(nil)
)

// New returns a Store of the tables named by o in the database of pool, and
// starts its sweeper unless o.SweepInterval is negative. It does no I/O: the
// tables need not exist yet (run Migrate), and the database may be down;
// the first Take, Peek or Sweep checks the schema's version. The sweeper's
// statements carry ctx's values but not its cancellation or deadline: Close
// stops them. The pool stays the caller's: Close does not close it. Errors
// wrap sluice.ErrInvalidOption and name the option.
func New(ctx context.Context, pool *pgxpool.Pool, o Options) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", sluice.ErrInvalidOption)
	}
	if err := o.checkTables(); err != nil {
		return nil, err
	}
	if err := o.OnLimitChange.Validate(); err != nil {
		return nil, fmt.Errorf("%w (Options.OnLimitChange)", err)
	}
	switch {
	case o.RequestIDTTL < 0:
		return nil, fmt.Errorf("%w: RequestIDTTL %v is negative; use a positive duration, or 0 for the default %v", sluice.ErrInvalidOption, o.RequestIDTTL, DefaultRequestIDTTL)
	case o.RequestIDTTL == 0:
		o.RequestIDTTL = DefaultRequestIDTTL
	}
	if err := o.checkTimeouts(); err != nil {
		return nil, err
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = DefaultSweepInterval
	}
	switch {
	case o.SweepBatch < 0 || o.SweepBatch > MaxSweepBatch:
		return nil, fmt.Errorf("%w: SweepBatch %d is outside [1, %d] (0 for the default %d)", sluice.ErrInvalidOption, o.SweepBatch, MaxSweepBatch, DefaultSweepBatch)
	case o.SweepBatch == 0:
		o.SweepBatch = DefaultSweepBatch
	}
	switch r := o.SweepPauseRatio; {
	case math.IsNaN(r) || math.IsInf(r, 1):
		return nil, fmt.Errorf("%w: SweepPauseRatio %v is not a number of times a batch's duration; use a finite number, 0 for the default %v, or a negative one for no pause", sluice.ErrInvalidOption, r, DefaultSweepPauseRatio)
	case r == 0:
		o.SweepPauseRatio = DefaultSweepPauseRatio
	case r < 0:
		o.SweepPauseRatio = 0
	}
	switch {
	case o.Batch < 0 || o.Batch > MaxBatch:
		return nil, fmt.Errorf("%w: Batch %d is outside [1, %d] (0 for the default %d, 1 for no batching)", sluice.ErrInvalidOption, o.Batch, MaxBatch, DefaultBatch)
	case o.Batch == 0:
		o.Batch = DefaultBatch
	}
	switch {
	case o.Transactions < 0:
		return nil, fmt.Errorf("%w: Transactions %d is negative; use 1 or more, or 0 for the default %d", sluice.ErrInvalidOption, o.Transactions, DefaultTransactions)
	case o.Transactions == 0:
		o.Transactions = DefaultTransactions
	}
	n := newNames(o.Schema, o.Table)
	s := &Store{
		pool:      pool,
		schema:    o.Schema,
		names:     n,
		migration: migrationSQL(n),
		queries:   newQueries(n),
		conv:      int32(o.OnLimitChange),
		idTTL:     ceilMicros(o.RequestIDTTL),
		now:       o.Now,
		batch:     int32(o.SweepBatch),
		pause:     o.SweepPauseRatio,
		done:      make(chan struct{}),
	}
	s.insertScore.Store(insertFirstStart)
	if o.Batch > 1 {
		s.batcher = &batcher{s: s, max: o.Batch, flights: o.Transactions}
	}
	params := pool.Config().ConnConfig.RuntimeParams
	s.prelude, s.timeouts, s.session = prelude(o.StatementTimeout, o.LockTimeout, params)
	s.lift = lift(params)
	if o.SweepInterval > 0 {
		sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s.cancelSweeper = cancel
		go s.sweeper(sctx, o.SweepInterval)
	} else {
		close(s.done)
	}
	return s, nil
}

// checkTables sets the default Schema and Table where they are empty, and
// checks both names.
func (o *Options) checkTables() error {
	if o.Schema == "" {
		o.Schema = DefaultSchema
	}
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if err := checkName("Schema", o.Schema, MaxSchemaLen); err != nil {
		return err
	}
	return checkName("Table", o.Table, MaxTableLen)
}

// queries are the statements that call the schema's functions.
type queries struct {
	takeSQL, peekSQL, takeAllSQL, refundSQL, resetSQL, sweepSQL string
	// createSQL and floorSQL take from a new bucket (create.go).
	createSQL, floorSQL string
}

func newQueries(n names) queries {
	return queries{
		takeSQL: "SELECT o_status, o_allowed, o_remaining, o_retry_us, o_reset_us, o_cost, o_capacity, o_rate_tokens, o_period_us, o_lock_wait_us, o_converted FROM " +
			n.Take + "($1::text, $2::bytea, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
		peekSQL: "SELECT o_allowed, o_remaining, o_retry_us, o_reset_us FROM " + n.Peek + "($1::text, $2::bytea, $3, $4, $5, $6, $7, $8, $9, $10)",
		takeAllSQL: "SELECT o_allowed, o_remaining, o_retry_us, o_reset_us, o_taken, o_lock_wait_us, o_conversions FROM " +
			n.TakeAll + "($1::text[], $2::bytea[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9, $10, $11)",
		refundSQL: "SELECT o_status, o_remaining, o_reset_us, o_added, o_cost, o_capacity, o_rate_tokens, o_period_us, o_lock_wait_us, o_converted FROM " +
			n.Refund + "($1::text, $2::bytea, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
		resetSQL: "SELECT o_reset FROM " + n.Reset + "($1::text, $2::bytea, $3)",
		sweepSQL: "SELECT o_buckets, o_request_ids FROM " + n.Sweep + "($1, $2)",
		createSQL: "INSERT INTO " + n.Buckets + " AS b (policy, key, tokens, frac, stamp, capacity, rate_tokens, period_us, full_at) " +
			"SELECT $1::text, $2::bytea, $4::bigint - $3::bigint, 0, n.now, $4, $5, $6, " +
			"CASE WHEN $7::bigint IS NULL OR n.now >= 9223372036854775807 - $7::bigint THEN NULL ELSE n.now + $7::bigint END " +
			"FROM (SELECT m.now, set_config('" + stampSetting + "', m.now::text, true) AS stamp " +
			"FROM (SELECT coalesce($8::bigint, " + n.Clock + "()) AS now) AS m) AS n " +
			"WHERE n.stamp IS NOT NULL AND current_setting('transaction_isolation') = 'read committed' " +
			"AND NOT EXISTS (SELECT FROM " + n.Buckets + " AS e WHERE e.policy = $1::text AND e.key = $2::bytea) " +
			"ON CONFLICT (policy, key) DO NOTHING RETURNING b.stamp",
		floorSQL: "SELECT int8(concat('" + floorMarker + " ', f.floor_us)) FROM " + n.Floor + " AS f " +
			"WHERE f.floor_us > nullif(current_setting('" + stampSetting + "', true), '')::bigint",
	}
}

// checkTimeouts sets the default StatementTimeout and LockTimeout where
// they are 0, and checks both.
func (o *Options) checkTimeouts() error {
	for _, t := range []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{{"StatementTimeout", &o.StatementTimeout, DefaultStatementTimeout}, {"LockTimeout", &o.LockTimeout, DefaultLockTimeout}} {
		switch {
		case *t.d > MaxTimeout:
			return fmt.Errorf("%w: %s %v is longer than PostgreSQL allows (%v); use at most that, or a negative value for no timeout", sluice.ErrInvalidOption, t.name, *t.d, MaxTimeout)
		case *t.d == 0:
			*t.d = t.def
		}
	}
	return nil
}

// SessionTimeouts sets statement_timeout and lock_timeout to o's
// StatementTimeout and LockTimeout (or their defaults) in the startup
// parameters of cfg's connections (cfg.ConnConfig.RuntimeParams), so that
// every session of a pool made from cfg starts with them (replacing any
// other spelling of their names there); a negative one is left as cfg has
// it. A Store of that pool with the same timeouts then sends
// no statement to set them in each transaction, a statement that cost
// 4-9 % of the takes a second of new keys (docs/BENCHMARKS.md): New
// compares its timeouts with its pool's startup parameters, and a decision
// sets only those that differ.
//
// Every statement on such a pool runs under these timeouts, so give the
// store a pool of its own. The store's sweeps and Migrate lift them for
// their own transactions (set to 0, no timeout but the context's), and so
// does the warm-up of AfterConnect. A connection pooler between the pool and
// PostgreSQL may refuse startup parameters (PgBouncer) or drop them
// (PgBouncer with ignore_startup_parameters); the store's first call reads
// the timeouts back on one connection, and the warm-up of AfterConnect on
// every new one, and a session without them fails the decision with an
// error wrapping sluice.ErrMisconfigured. Behind such a pooler leave the
// timeouts to each transaction instead: do not call SessionTimeouts.
// Errors are New's for a bad timeout.
func SessionTimeouts(cfg *pgxpool.Config, o Options) error {
	if cfg == nil || cfg.ConnConfig == nil {
		return fmt.Errorf("%w: the pool's config is nil", sluice.ErrInvalidOption)
	}
	if err := o.checkTimeouts(); err != nil {
		return err
	}
	if cfg.ConnConfig.RuntimeParams == nil {
		cfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	for _, t := range timeoutSettings(o.StatementTimeout, o.LockTimeout) {
		// One spelling of the name, so that the session's value is known.
		for _, k := range paramNames(cfg.ConnConfig.RuntimeParams, t.name) {
			delete(cfg.ConnConfig.RuntimeParams, k)
		}
		cfg.ConnConfig.RuntimeParams[t.name] = t.value()
	}
	return nil
}

// A sessionTimeout is one of PostgreSQL's timeout settings, in whole ms.
type sessionTimeout struct {
	name string // statement_timeout or lock_timeout
	ms   int64
}

// value is t as PostgreSQL reads it.
func (t sessionTimeout) value() string { return fmt.Sprintf("%dms", t.ms) }

// timeoutSettings returns the enabled (positive) timeouts, in whole
// milliseconds rounded up.
func timeoutSettings(statement, lock time.Duration) []sessionTimeout {
	var ts []sessionTimeout
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"statement_timeout", statement}, {"lock_timeout", lock}} {
		if t.d > 0 {
			ts = append(ts, sessionTimeout{t.name, int64((t.d + time.Millisecond - 1) / time.Millisecond)})
		}
	}
	return ts
}

// prelude returns the statement that sets, for the current transaction
// only, the enabled timeouts that the sessions do not start with (params
// are their startup parameters), and its arguments; and the timeouts they
// start with.
func prelude(statement, lock time.Duration, params map[string]string) (string, []any, []sessionTimeout) {
	var sets []string
	var args []any
	var session []sessionTimeout
	for _, t := range timeoutSettings(statement, lock) {
		if params[t.name] == t.value() && len(paramNames(params, t.name)) == 1 {
			session = append(session, t)
			continue
		}
		args = append(args, t.value())
		sets = append(sets, fmt.Sprintf("set_config('%s', $%d, true)", t.name, len(args)))
	}
	if len(sets) == 0 {
		return "", nil, session
	}
	return "SELECT " + strings.Join(sets, ", "), args, session
}

// paramNames returns the keys of params that name the setting name:
// PostgreSQL's names are not case-sensitive, so a config may hold several
// (and which one a session ends up with is not known).
func paramNames(params map[string]string, name string) []string {
	var keys []string
	for k := range params {
		if strings.EqualFold(k, name) {
			keys = append(keys, k)
		}
	}
	return keys
}

// lift returns the statement that turns off, for the current transaction
// only, the timeouts that sessions with the startup parameters params
// start with (whatever their values), or "" if there are none.
func lift(params map[string]string) string {
	var named []string
	for _, name := range timeoutNames {
		if len(paramNames(params, name)) > 0 {
			named = append(named, name)
		}
	}
	return liftNames(named)
}

// timeoutNames are the settings of StatementTimeout and LockTimeout.
var timeoutNames = []string{"statement_timeout", "lock_timeout"}

// liftNames returns the statement that turns off the settings names for
// the current transaction only, or "" if there are none.
func liftNames(names []string) string {
	var sets []string
	for _, name := range names {
		sets = append(sets, fmt.Sprintf("set_config('%s', '0', true)", name))
	}
	if len(sets) == 0 {
		return ""
	}
	return "SELECT " + strings.Join(sets, ", ")
}

// Close stops the sweeper and waits for it to exit, cancelling a sweep in
// progress. The store stays usable for decisions. Close is idempotent and
// always returns nil.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.cancelSweeper != nil {
			s.cancelSweeper()
		}
		<-s.done
	})
	return nil
}

// CheckLimit implements sluice.LimitChecker: the store decides every valid
// limit whose period is a whole number of microseconds, its time unit, and
// no other. (Within that bound the SQL is exact: quantities that may exceed
// 64 bits are computed in numeric.) The error wraps sluice.ErrInvalidLimit.
func (s *Store) CheckLimit(l sluice.Limit) error {
	_, err := plan(l)
	return err
}

// plan returns the Plan of l at the store's tick of 1µs.
func plan(l sluice.Limit) (bucket.Plan, error) {
	if err := l.Validate(); err != nil {
		return bucket.Plan{}, err
	}
	if l.Rate.Period%time.Microsecond != 0 {
		return bucket.Plan{}, fmt.Errorf("%w: period %v is not a whole number of microseconds (the PostgreSQL store's time unit)", sluice.ErrInvalidLimit, l.Rate.Period)
	}
	return bucket.NewPlan(l, time.Microsecond)
}

// Take implements sluice.Store. It validates r (errors wrap the sluice
// sentinels; a limit that CheckLimit refuses is sluice.ErrInvalidLimit),
// then makes the decision in one transaction: one statement, the take
// function, or, for a new key, two plain statements that create the bucket
// (docs/postgres.md, "Takes of new keys"); while Options.Transactions
// takes are in flight, one call of the take function in a transaction
// shared with other takes (Options.Batch). A request ID remembered with
// another cost or limit is sluice.ErrRequestIDConflict. A database that
// cannot decide is an error wrapping sluice.ErrUnavailable, and a schema
// that is missing or older than SchemaVersion one wrapping
// sluice.ErrMisconfigured; neither is ever a denial.
func (s *Store) Take(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.Validate(); err != nil {
		return sluice.Decision{}, err
	}
	p, err := plan(r.Limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	if err := s.checkSchema(ctx, "take"); err != nil {
		return sluice.Decision{}, err
	}
	now := s.nowMicros()
	if s.batcher != nil {
		return s.batcher.take(ctx, r, p, now)
	}
	return s.takeOne(ctx, r, p, now)
}

// takeOne decides r, valid under plan p, at the time now (nowMicros), in a
// transaction of its own: the insert-first pair for a new key where it
// applies (create.go), else the take function.
func (s *Store) takeOne(ctx context.Context, r sluice.Request, p bucket.Plan, now any) (sluice.Decision, error) {
	key := []byte(r.Key)
	if r.RequestID == "" && s.current.Load() && smallPlan(r.Limit, p) && s.insertFirst() {
		d, created, err := s.takeNew(ctx, r, p, key, now)
		if err != nil || created {
			return d, err
		}
	}
	var out takeOut
	if err := s.queryRow(ctx, s.takeSQL, out.dst(), s.takeArgs(r, p, key, now)...); err != nil {
		return sluice.Decision{}, s.decisionError("take", err)
	}
	return s.takeDecision(r, &out)
}

// takeOut holds the columns of one row of the take function.
type takeOut struct {
	status                                 int32
	allowed, converted                     bool
	remaining, retry, reset                int64
	idCost, idCapacity, idTokens, idPeriod int64
	lockWait                               int64 // µs
}

// dst returns the scan targets of the take function's columns, in order.
func (o *takeOut) dst() []any {
	return []any{&o.status, &o.allowed, &o.remaining, &o.retry, &o.reset, &o.idCost, &o.idCapacity, &o.idTokens, &o.idPeriod, &o.lockWait, &o.converted}
}

// takeArgs returns the take function's arguments for r under plan p at the
// time now (nowMicros), with key the bytes of r.Key.
func (s *Store) takeArgs(r sluice.Request, p bucket.Plan, key []byte, now any) []any {
	var id []byte
	if r.RequestID != "" {
		id = []byte(r.RequestID)
	}
	return []any{r.Policy, key, r.Cost,
		r.Limit.Capacity, r.Limit.Rate.Tokens, int64(r.Limit.Rate.Period / time.Microsecond), int64(p.RefillUnits()), int64(p.Scale()),
		s.conv, id, s.idTTL, now}
}

// takeDecision counts the take function's row o for r in Stats and
// returns its decision, or the request-ID conflict it reports.
func (s *Store) takeDecision(r sluice.Request, o *takeOut) (sluice.Decision, error) {
	s.count(o.lockWait, one(o.converted))
	if o.status == statusConflict {
		first := sluice.Limit{Capacity: o.idCapacity, Rate: sluice.Rate{Tokens: o.idTokens, Period: time.Duration(o.idPeriod) * time.Microsecond}}
		return sluice.Decision{}, fmt.Errorf("%w: request ID %q for this policy and key was first used with cost %d and limit %v, now cost %d and limit %v",
			sluice.ErrRequestIDConflict, r.RequestID, o.idCost, first, r.Cost, r.Limit)
	}
	// A replay has the request's cost and limit: the conflict check above
	// compared them with the remembered ones.
	return sluice.Decision{
		Allowed:    o.allowed,
		Remaining:  o.remaining,
		RetryAfter: wait(o.retry),
		ResetAfter: wait(o.reset),
		Limit:      r.Limit,
		Replayed:   o.status == statusReplayed,
	}, nil
}

// decisionError is dbError for a decision, which counts a lock timeout
// in Stats.
func (s *Store) decisionError(op string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available
		s.lockTimeouts.Add(1)
	}
	return s.dbError(op, err)
}

// count adds a decision's wait for row locks (µs) and the buckets it
// converted to Stats.
func (s *Store) count(lockWait int64, conversions int32) {
	if lockWait > 0 {
		s.lockWaits.Add(1)
		s.lockWaitMicros.Add(uint64(lockWait))
	}
	if conversions > 0 {
		s.conversions.Add(uint64(conversions))
	}
}

// one returns 1 for true, 0 for false.
func one(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// The o_status of the take function.
const (
	statusDecided  = 0
	statusReplayed = 1
	statusConflict = 2
)

// Peek implements sluice.Store: whether a take of r.Cost from the bucket of
// (r.Policy, r.Key) under r.Limit would succeed now, and when, converted if
// the bucket was last decided under another limit. It locks, writes and
// creates nothing. r is checked with ValidatePeek (no request ID); errors
// are otherwise those of Take.
func (s *Store) Peek(ctx context.Context, r sluice.Request) (sluice.Decision, error) {
	if err := r.ValidatePeek(); err != nil {
		return sluice.Decision{}, err
	}
	p, err := plan(r.Limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	if err := s.checkSchema(ctx, "peek"); err != nil {
		return sluice.Decision{}, err
	}
	l := r.Limit
	var (
		allowed                 bool
		remaining, retry, reset int64
	)
	err = s.queryRow(ctx, s.peekSQL, []any{&allowed, &remaining, &retry, &reset},
		r.Policy, []byte(r.Key), r.Cost, l.Capacity, l.Rate.Tokens, int64(l.Rate.Period/time.Microsecond), int64(p.RefillUnits()), int64(p.Scale()),
		s.conv, s.nowMicros())
	if err != nil {
		return sluice.Decision{}, s.dbError("peek", err)
	}
	return sluice.Decision{
		Allowed:    allowed,
		Remaining:  remaining,
		RetryAfter: wait(retry),
		ResetAfter: wait(reset),
		Limit:      l,
	}, nil
}

// queryRow runs sql with args, after the timeout prelude in the same
// transaction and round trip, and scans its one row into dst.
func (s *Store) queryRow(ctx context.Context, sql string, dst []any, args ...any) error {
	return s.queryRowAfter(ctx, s.prelude, s.timeouts, sql, dst, args...)
}

// queryRowAfter runs sql with args after pre with preArgs (none if pre is
// ""), in one transaction and round trip, and scans sql's one row into dst.
func (s *Store) queryRowAfter(ctx context.Context, pre string, preArgs []any, sql string, dst []any, args ...any) error {
	if pre == "" {
		return s.pool.QueryRow(ctx, sql, args...).Scan(dst...)
	}
	// A batch is sent as one pipeline ending in one Sync: both statements
	// run in one implicit transaction, so set_config(..., true) applies to
	// the decision and ends with it. (PostgreSQL arms or disarms the
	// statement timeout anew for each statement of a pipeline.)
	b := &pgx.Batch{}
	b.Queue(pre, preArgs...)
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error { return row.Scan(dst...) })
	return s.pool.SendBatch(ctx, b).Close()
}

// nowMicros returns the explicit time in µs since the Unix epoch, or nil
// (SQL NULL: the database clock).
func (s *Store) nowMicros() any {
	if s.now == nil {
		return nil
	}
	return s.now().UnixMicro()
}

// wait converts a wait in µs from SQL (-1: never) to a Duration.
func wait(us int64) time.Duration {
	if us < 0 {
		return sluice.Never
	}
	return time.Duration(us) * time.Microsecond
}

// ceilMicros returns d in whole microseconds, rounded up.
func ceilMicros(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond != 0 {
		us++
	}
	return us
}
