package redis

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/redis/rueidis"
)

// scriptPath is sluice's script, read at test time so the script limiters
// run the text redisstore embeds.
const scriptPath = "../../redisstore/bucket.lua"

// scriptArgs are the ARGV redisstore sends for a take without a request ID
// under the benchmark limit: operation, time from Redis TIME, the spec,
// cost 1. The spec is what redisstore encodes (see its bucket.lua):
// capacity 1000, 1000 tokens per 1,000,000 µs and the reduced rate 1/1000
// as little-endian integers of 6 bytes, policy 0 (keep) in 1, least TTL 0
// ms in 7.
var scriptArgs = []string{"take", "redis", benchSpec(1000, 1000, 1_000_000, 1, 1000), "1"}

// benchSpec encodes a spec with policy 0 and least TTL 0.
func benchSpec(fields ...int64) string {
	var b []byte
	for _, v := range fields {
		for range 6 {
			b = append(b, byte(v))
			v >>= 8
		}
	}
	return string(append(b, make([]byte, 1+7)...))
}

// clientLimiters compare Redis clients under sluice's script: redisstore
// with its default batching through go-redis (sluiceDefault), the bare script through
// go-redis (one EVALSHA call per decision), and the bare script through
// rueidis (one EVALSHA per decision, with rueidis's default
// auto-pipelining of concurrent calls on shared connections). The script
// limiters use the workload keys as they are ("hot", "user:N"); the
// database is flushed before each cell.
var clientLimiters = []limiter{
	sluiceDefault,
	{"goredis-script", func(tb testing.TB, callers int) (decider, func()) {
		src := readScript(tb)
		c := newClient(callers)
		sha, err := c.ScriptLoad(context.Background(), src).Result()
		if err != nil {
			c.Close()
			tb.Fatal(err)
		}
		args := make([]any, len(scriptArgs))
		for i, a := range scriptArgs {
			args[i] = a
		}
		return func(ctx context.Context, key string) (bool, error) {
			reply, err := c.EvalSha(ctx, sha, []string{key}, args...).Slice()
			if err != nil {
				return false, err
			}
			if len(reply) != 5 || reply[0] != "ok" {
				return false, fmt.Errorf("goredis-script: reply %v", reply)
			}
			allowed, ok := reply[1].(int64)
			if !ok {
				return false, fmt.Errorf("goredis-script: reply %v", reply)
			}
			return allowed == 1, nil
		}, func() { c.Close() }
	}},
	{"rueidis-script", func(tb testing.TB, callers int) (decider, func()) {
		src := readScript(tb)
		c, err := newRueidis()
		if err != nil {
			tb.Fatal(err)
		}
		lua := rueidis.NewLuaScript(src)
		return func(ctx context.Context, key string) (bool, error) {
			reply, err := lua.Exec(ctx, c, []string{key}, scriptArgs).ToArray()
			if err != nil {
				return false, err
			}
			if len(reply) != 5 {
				return false, fmt.Errorf("rueidis-script: reply of %d elements", len(reply))
			}
			if s, err := reply[0].ToString(); err != nil || s != "ok" {
				return false, fmt.Errorf("rueidis-script: reply status %q, %v", s, err)
			}
			allowed, err := reply[1].AsInt64()
			if err != nil {
				return false, err
			}
			return allowed == 1, nil
		}, func() { c.Close() }
	}},
}

// readScript returns the text of sluice's script.
func readScript(tb testing.TB) string {
	b, err := os.ReadFile(scriptPath)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// newRueidis returns a rueidis client on the server and database of opts,
// without retries and with its default auto-pipelining.
func newRueidis() (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  []string{opts.Addr},
		Username:     opts.Username,
		Password:     opts.Password,
		SelectDB:     opts.DB,
		DisableRetry: true,
	})
}

// BenchmarkClients runs the workloads and metrics of BenchmarkDecisions
// (decisions/s, %allowed, script-µs/decision, calls/decision,
// redis-cpu-µs/decision at 1, 16 and 64 callers on one hot key and on
// 100,000 keys) for clientLimiters: whether rueidis, which pipelines
// concurrent calls by itself, decides faster than one go-redis call per
// decision, and than redisstore's own batching through go-redis.
//
//	cd bench && go test -run '^$' -bench Clients -benchtime 30000x ./redis/
func BenchmarkClients(b *testing.B) {
	runLimiters(b, clientLimiters)
}
