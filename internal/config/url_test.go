package config

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestURLNeverShowsItsPassword(t *testing.T) {
	tests := []struct {
		raw, want string
	}{
		{"redis://:s3cret@h:6379/0", "redis://:xxxxx@h:6379/0"},
		{"rediss://user:s3cret@h:6380", "rediss://user:xxxxx@h:6380"},
		{"unix://user:s3cret@/run/redis.sock", "unix://user:xxxxx@/run/redis.sock"},
		{"postgres://u@db/x?password=s3cret&sslmode=require", "postgres://u@db/x?password=xxxxx&sslmode=require"},
		{"postgres://u@db/x?sslpassword=s3cret", "postgres://u@db/x?sslpassword=xxxxx"},
		{"redis://h:6379?auth_token=s3cret", "redis://h:6379?auth_token=xxxxx"},
		{"redis://:s3cret%zz@h:6379", "(an invalid URL, not shown)"},
		{"redis://h:6379", "redis://h:6379"},
		{"", ""},
	}
	for _, tt := range tests {
		u := NewURL(tt.raw)
		if got := u.String(); got != tt.want {
			t.Errorf("NewURL(%q).String() = %q, want %q", tt.raw, got, tt.want)
		}
		if got := u.Value(); got != tt.raw {
			t.Errorf("NewURL(%q).Value() = %q, want it as written", tt.raw, got)
		}
		text, err := u.MarshalText()
		if err != nil || string(text) != tt.want {
			t.Errorf("NewURL(%q).MarshalText() = %q, %v; want %q, nil", tt.raw, text, err, tt.want)
		}
		c := Default()
		c.Store = Store{Type: StoreRedis, Redis: RedisStore{URL: u}, Postgres: PostgresStore{URL: u}}
		js, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		shown := []string{string(js), c.String()}
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3s"} {
			shown = append(shown, fmt.Sprintf(verb, u), fmt.Sprintf(verb, c), fmt.Sprintf(verb, &c), fmt.Sprintf(verb, c.Store.Redis))
		}
		for _, s := range shown {
			if strings.Contains(s, "s3cret") || strings.Contains(s, "73336372657") {
				t.Errorf("a formatted config with the URL %q shows the password: %s", tt.raw, s)
			}
		}
	}
}
