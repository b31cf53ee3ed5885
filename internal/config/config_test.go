package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

var update = flag.Bool("update", false, "rewrite the .golden files of testdata/good")

// golden is what a good fixture's .golden file holds: Describe, then the
// warnings.
func golden(c *Config) string {
	var b strings.Builder
	if err := c.Describe(&b); err != nil {
		panic(err)
	}
	b.WriteString("warnings:\n")
	for _, w := range c.Warnings() {
		b.WriteString("- " + w + "\n")
	}
	return b.String()
}

func TestGoodFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/good/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no good fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse = %v, want no error", err)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("Validate of the parsed config = %v, want nil", err)
			}
			sum := sha256.Sum256(data)
			if want := hex.EncodeToString(sum[:])[:12]; c.Version != want {
				t.Errorf("Version = %q, want %q", c.Version, want)
			}
			loaded, err := Load(file)
			if err != nil || !reflect.DeepEqual(loaded, c) {
				t.Errorf("Load = %+v, %v; want %+v, nil (as Parse)", loaded, err, c)
			}
			got := golden(&c)
			gf := strings.TrimSuffix(file, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(gf, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(gf)
			if err != nil {
				t.Fatalf("%v (run go test -update to write it)", err)
			}
			if got != string(want) {
				t.Errorf("Describe and Warnings =\n%s\nwant (%s)\n%s", got, gf, want)
			}
			if strings.Contains(got, "s3cret") {
				t.Errorf("Describe shows a password:\n%s", got)
			}
		})
	}
}

// wants returns the expected error fragments of a bad fixture: its
// leading "# want: " lines, in order.
func wants(data []byte) []string {
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		w, ok := strings.CutPrefix(line, "# want: ")
		if !ok {
			break
		}
		out = append(out, w)
	}
	return out
}

func TestBadFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			want := wants(data)
			if len(want) == 0 {
				t.Fatal("the fixture has no leading # want: line")
			}
			c, err := Parse(data)
			if err == nil {
				t.Fatalf("Parse = %+v, nil; want an error", c)
			}
			if !errors.Is(err, ErrInvalid) || !errors.Is(err, sluice.ErrInvalidOption) {
				t.Errorf("Parse error %v does not wrap ErrInvalid and sluice.ErrInvalidOption", err)
			}
			if !reflect.DeepEqual(c, Config{}) {
				t.Errorf("Parse returned %+v with its error, want the zero Config", c)
			}
			got := Errors(err)
			if len(got) != len(want) {
				t.Fatalf("Parse found %d problems, want %d:\n%v", len(got), len(want), err)
			}
			for i, e := range got {
				if !strings.Contains(e.Error(), want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, e.Error(), want[i])
				}
				if e.Msg == "" {
					t.Errorf("problem %d has no message", i)
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows a password: %v", err)
			}
			_, lerr := Load(file)
			for _, e := range Errors(lerr) {
				if e.File != file || !strings.HasPrefix(e.Error(), file+":") {
					t.Errorf("Load problem %q does not name the file %s", e.Error(), file)
				}
			}
		})
	}
}

// TestManyProblems checks that every problem of a file is reported, in
// the order of the lines, and that none of them hides another.
func TestManyProblems(t *testing.T) {
	data := []byte(`listen:
  http: 8080
  admin: ":8080"
  grpcs: ":9000"
store:
  type: redis
  redis:
    url: "redis://:s3cret@localhost:99999"
    tls: true
guard:
  timeout: 1m
  failure_mode: fail-open
policies:
  api: {limit: "100 10/x"}
  login:
    limits: ["5 5/s", "5 5/s"]
    shadow: maybe
  ok: {limit: "1 1/s"}
`)
	want := []string{
		"line 2: listen.http: is the number 8080",
		"line 4: listen.grpcs: is not a known key",
		"line 8: store.redis.url: redis://:xxxxx@localhost:99999 has port \"99999\"",
		"line 9: store.redis.tls: is set with url",
		"line 11: guard.timeout: is 1m; want a duration from 1ms to 10s",
		"line 12: guard.failure_mode: is \"fail-open\"",
		"line 14: policies.api.limit: \"100 10/x\" is not a limit",
		"line 17: policies.login.shadow: is a string; want true or false",
	}
	_, err := Parse(data)
	got := Errors(err)
	if len(got) != len(want) {
		t.Fatalf("Parse found %d problems, want %d:\n%v", len(got), len(want), err)
	}
	for i, e := range got {
		if !strings.Contains(e.Error(), want[i]) {
			t.Errorf("problem %d = %q, want it to contain %q", i, e.Error(), want[i])
		}
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the error shows a password: %v", err)
	}
}

func TestMaxProblems(t *testing.T) {
	var b strings.Builder
	b.WriteString("policies:\n")
	for i := range MaxProblems + 5 {
		b.WriteString("  p" + strconv.Itoa(i) + ": {limit: x}\n")
	}
	_, err := Parse([]byte(b.String()))
	got := Errors(err)
	if len(got) != MaxProblems+1 || got[MaxProblems-1].Line != MaxProblems+1 || got[MaxProblems].Msg != "and 5 more problems, not shown" {
		t.Errorf("Parse of %d bad policies: %d problems, the last two %v and %v; want %d, ending with the one of line %d and \"and 5 more problems, not shown\"",
			MaxProblems+5, len(got), got[len(got)-2], got[len(got)-1], MaxProblems+1, MaxProblems+1)
	}
}

func TestTooLarge(t *testing.T) {
	data := append([]byte("policies: {api: {limit: \"1 1/s\"}}\n"), bytes.Repeat([]byte("# padding\n"), MaxSize/10+1)...)
	_, err := Parse(data)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "more than 1048576 bytes") {
		t.Errorf("Parse of %d bytes = %v, want a problem naming the 1 MiB bound", len(data), err)
	}
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), path+": the file is more than") {
		t.Errorf("Load of %d bytes = %v, want a problem naming the file and the bound", len(data), err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.yaml"))
	if !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("Load of a missing file = %v, want an os.ErrNotExist error that is not ErrInvalid", err)
	}
}

func TestDefault(t *testing.T) {
	c := Default()
	parsed, err := Parse([]byte(DefaultYAML))
	if err != nil {
		t.Fatalf("Parse(DefaultYAML) = %v", err)
	}
	if !reflect.DeepEqual(c, parsed) {
		t.Errorf("Default() = %+v, want Parse(DefaultYAML) = %+v", c, parsed)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Default().Validate() = %v", err)
	}
	if c.Version != version([]byte(DefaultYAML)) {
		t.Errorf("Default().Version = %q, want the hash of DefaultYAML %q", c.Version, version([]byte(DefaultYAML)))
	}
	want := []Policy{{Name: "default", Limits: []sluice.Limit{{Capacity: 100, Rate: sluice.PerSecond(10)}}}}
	if !reflect.DeepEqual(c.Policies, want) {
		t.Errorf("Default().Policies = %+v, want %+v", c.Policies, want)
	}
	if c.Store.Type != StoreMemory || c.Listen.HTTP != ":8080" || c.Listen.Admin != "127.0.0.1:9090" {
		t.Errorf("Default() store %q, listen %+v; want memory, :8080 and 127.0.0.1:9090", c.Store.Type, c.Listen)
	}
	// Default returns a copy: changing one does not change the next.
	c.Policies[0].Limits[0].Capacity = 1
	c.Policies[0].Name = "changed"
	if again := Default(); !reflect.DeepEqual(again, parsed) {
		t.Errorf("Default() after changing an earlier result = %+v, want %+v", again, parsed)
	}
}

// TestDefaultsOfSections checks the defaults each store type fills in, and
// that a file with only policies gets the same values as Default.
func TestDefaultsOfSections(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want func(c *Config)
	}{
		{"memory", `policies: {default: {limit: "100 10/s"}}`, func(c *Config) {}},
		{"redis", "store: {type: redis, redis: {url: \"redis://r:6379\"}}\npolicies: {default: {limit: \"100 10/s\"}}", func(c *Config) {
			c.Store.Type = StoreRedis
			c.Store.Memory = MemoryStore{}
			c.Store.Redis = RedisStore{URL: NewURL("redis://r:6379"), Prefix: "sluice:", Batch: DefaultRedisBatch, Pipelines: DefaultRedisPipelines}
		}},
		{"postgres", "store: {postgres: {url: \"postgres://db/s\"}, type: postgres}\npolicies: {default: {limit: \"100 10/s\"}}", func(c *Config) {
			c.Store.Type = StorePostgres
			c.Store.Memory = MemoryStore{}
			c.Store.Postgres = PostgresStore{URL: NewURL("postgres://db/s"), Schema: "public", Table: "sluice_buckets", StatementTimeout: DefaultStatementTimeout, LockTimeout: DefaultLockTimeout, Batch: DefaultPGBatch, Transactions: DefaultPGTransactions}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			want.Version = version([]byte(tt.yaml))
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Parse(%q) =\n%+v\nwant\n%+v", tt.yaml, got, want)
			}
		})
	}
}

// TestExampleInDocs checks that the package documentation and
// docs/config.md show testdata/good/full.yaml as it is.
func TestExampleInDocs(t *testing.T) {
	full, err := os.ReadFile("testdata/good/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var indented strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(string(full), "\n"), "\n") {
		if line == "" {
			indented.WriteString("//\n")
		} else {
			indented.WriteString("//\t" + line + "\n")
		}
	}
	if !strings.Contains(string(doc), indented.String()) {
		t.Error("doc.go does not show testdata/good/full.yaml as its example")
	}
	md, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "```yaml\n"+string(full)+"```\n") {
		t.Error("docs/config.md does not show testdata/good/full.yaml in a yaml block")
	}
	if !strings.Contains(string(md), "```yaml\n"+DefaultYAML+"```\n") {
		t.Error("docs/config.md does not show default.yaml in a yaml block")
	}
	c, err := Parse(full)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "```\n"+c.String()+"```\n") {
		t.Errorf("docs/config.md does not show what config check prints for the example:\n%s", c.String())
	}
}

// TestValidate checks configs built in code: every problem is found, each
// names its field, and none has a line.
func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string
	}{
		{"default", func(c *Config) {}, nil},
		{"unknown store type", func(c *Config) { c.Store.Type = "etcd" }, []string{`store.type: is "etcd"; want memory, redis or postgres`}},
		{"section of another store", func(c *Config) { c.Store.Redis.Prefix = "x:" }, []string{"store.redis: is set, but store.type is memory"}},
		{"conversion", func(c *Config) { c.Store.OnLimitChange = 9 }, []string{"store.on_limit_change: is 9; want keep, scale or reset"}},
		{"overflow", func(c *Config) { c.Store.Memory.Overflow = "" }, []string{`store.memory.overflow: is ""; want refuse`}},
		{"failure mode", func(c *Config) { c.Guard.FailureMode = "" }, []string{`guard.failure_mode: is ""; want local`}},
		{"zero guard", func(c *Config) { c.Guard = Guard{FailureMode: FailClosed} }, []string{
			"guard.timeout: is 0s; want a duration from 1ms to 10s",
			"guard.local_max_keys: is 0",
			"guard.breaker.window: is 0s",
			"guard.breaker.min_calls: is 0",
			"guard.breaker.probe_interval: is 0s",
		}},
		{"no policies", func(c *Config) { c.Policies = nil }, []string{"policies: no policy is defined"}},
		{"bad policies", func(c *Config) {
			c.Policies = []Policy{
				{Name: "", Limits: []sluice.Limit{{Capacity: 1, Rate: sluice.PerSecond(1)}}},
				{Name: "a"},
				{Name: "a", Limits: []sluice.Limit{{Capacity: 0, Rate: sluice.PerSecond(1)}}},
			}
		}, []string{
			`policies[""]: policy name is empty`,
			"policies.a: has no limit",
			"policies.a: is defined twice",
			"policies.a.limits[0]: capacity 0 is outside [1, 1099511627776]",
		}},
		{"redis url with user", func(c *Config) {
			c.Store = Store{Type: StoreRedis, RequestIDTTL: time.Minute, Redis: RedisStore{URL: NewURL("rediss://u:s3cret@h:6380/1"), Username: "u", Prefix: "p:", Batch: 1, Pipelines: 1}}
		}, []string{"store.redis.username: is set with url"}},
		{"redis unix url", func(c *Config) {
			c.Store = Store{Type: StoreRedis, RequestIDTTL: time.Minute, Redis: RedisStore{URL: NewURL("unix://h/run/redis.sock"), Prefix: "p:", Batch: 1, Pipelines: 1}}
		}, []string{"store.redis.url: unix://h/run/redis.sock has no socket path"}},
		{"redis sentinel", func(c *Config) {
			c.Store = Store{Type: StoreRedis, RequestIDTTL: time.Minute, Redis: RedisStore{Sentinel: Sentinel{Master: "m", Addrs: []string{"a:1", "a:1", ":2"}}, Prefix: "p:", Batch: 1, Pipelines: 1}}
		}, []string{
			`store.redis.sentinel.addrs[1]: "a:1" repeats addrs[0]`,
			`store.redis.sentinel.addrs[2]: ":2" has no host`,
		}},
		{"postgres url with fragment", func(c *Config) {
			c.Store = Store{Type: StorePostgres, RequestIDTTL: time.Minute, Postgres: PostgresStore{URL: NewURL("postgres://u:s3cret@db/x#f"), Schema: "s", Table: "t", StatementTimeout: time.Second, LockTimeout: time.Second, Batch: 1, Transactions: 1}}
		}, []string{"store.postgres.url: has a fragment"}},
		{"postgres batch and transactions out of range", func(c *Config) {
			c.Store = Store{Type: StorePostgres, RequestIDTTL: time.Minute, Postgres: PostgresStore{URL: NewURL("postgres://db/x"), Schema: "s", Table: "t", StatementTimeout: time.Second, LockTimeout: time.Second, Batch: 1001, Transactions: 0}}
		}, []string{"store.postgres.batch: is 1001; want a whole number from 1 to 1000", "store.postgres.transactions: is 0; want a whole number from 1 to 256"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.change(&c)
			err := c.Validate()
			got := Errors(err)
			if len(got) != len(tt.want) {
				t.Fatalf("Validate() found %d problems, want %d:\n%v", len(got), len(tt.want), err)
			}
			if err != nil && (!errors.Is(err, ErrInvalid) || !errors.Is(err, sluice.ErrInvalidOption)) {
				t.Errorf("Validate() = %v, does not wrap ErrInvalid and sluice.ErrInvalidOption", err)
			}
			for i, e := range got {
				if !strings.Contains(e.Error(), tt.want[i]) || e.Line != 0 {
					t.Errorf("problem %d = %q (line %d), want it to contain %q, with no line", i, e.Error(), e.Line, tt.want[i])
				}
			}
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("the error shows a password: %v", err)
			}
		})
	}
}

// TestCauses checks that a problem caused by a sluice check wraps its
// sentinel too.
func TestCauses(t *testing.T) {
	_, err := Parse([]byte("policies:\n  api: {limit: \"0 1/s\"}\n  \"x y\": {limit: \"1 1/s\"}\n"))
	if !errors.Is(err, sluice.ErrInvalidLimit) || !errors.Is(err, sluice.ErrInvalidPolicy) {
		t.Errorf("Parse = %v, want it to wrap sluice.ErrInvalidLimit and sluice.ErrInvalidPolicy", err)
	}
}

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{Error{File: "s.yaml", Line: 3, Path: "a.b", Msg: "m"}, "s.yaml:3: a.b: m"},
		{Error{File: "s.yaml", Msg: "m"}, "s.yaml: m"},
		{Error{Line: 3, Path: "a", Msg: "m"}, "line 3: a: m"},
		{Error{Path: "a", Msg: "m"}, "a: m"},
		{Error{Msg: "m"}, "m"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%+v.Error() = %q, want %q", tt.e, got, tt.want)
		}
	}
	if got := Errors(errors.New("other")); got != nil {
		t.Errorf("Errors(another error) = %v, want nil", got)
	}
}

func TestPolicyLookup(t *testing.T) {
	c := Default()
	if p, ok := c.Policy("default"); !ok || p.Name != "default" {
		t.Errorf("Policy(%q) = %+v, %v; want the default policy", "default", p, ok)
	}
	if p, ok := c.Policy("absent"); ok {
		t.Errorf("Policy(%q) = %+v, true; want false", "absent", p)
	}
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{5 * time.Minute, "5m"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{90 * time.Second, "1m30s"},
		{50 * time.Millisecond, "50ms"},
		{1500 * time.Millisecond, "1.5s"},
		{24 * time.Hour, "24h"},
		{0, "0s"},
	}
	for _, tt := range tests {
		if got := formatDuration(tt.d); got != tt.want {
			t.Errorf("formatDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

// TestSyntaxLines checks the line of YAML syntax errors, which yaml.v3
// counts from 0 for its parser's errors and from 1 for its scanner's, and
// leaves out on the first line.
func TestSyntaxLines(t *testing.T) {
	tests := []struct {
		yaml string
		line int
	}{
		{"b: c: d\n", 1},
		{"a: 1\nb: c: d\n", 2},
		{"a: 1\nb: [x\n", 2},
		{"a: 1\nb: {x: 1\n", 2},
		{"a: 1\nb:\n  - x\n  y: 1\n", 3},
		{"a: 1\n- b\n", 2},
		{"- a\nb: 1\n", 2},
		{"a: 1\nb: \"x\n", 2},
		{"a: 1\n\tb: 1\n", 2},
		{"a: 1\nb: @x\n", 2},
		{"a: 1\nb: \"\\q\"\n", 2},
		{"a:\n  b: 1\n c: 2\n", 3},
		{"a: 1\n  b: 2\n", 2},
		{"a: 1\nb: !x!y z\n", 2},
		{"a: [1,\n  2\nb: 3\n", 3},
		{"a: 1\nb: |\n x\n  y\nc\n", 5},
		{"a: 1\nb: \xff\n", 2},
		{"a: 1\nb: \x01\n", 2},
		{"{a: 1\n", 1},
		{"0: {", 1},
		{"a: 1\nb: [\n\n", 3}, // the blank line where the list should go on
	}
	for _, tt := range tests {
		_, err := Parse([]byte(tt.yaml))
		got := Errors(err)
		if len(got) != 1 || got[0].Line != tt.line {
			t.Errorf("Parse(%q) = %v, want one problem on line %d", tt.yaml, err, tt.line)
		}
	}
}
