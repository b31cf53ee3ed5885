package config_test

import (
	"errors"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/config"
)

func ExampleParse() {
	c, err := config.Parse([]byte(`
store:
  type: postgres
  postgres:
    url: "postgres://sluice:s3cret@db.internal/sluice"
guard:
  failure_mode: closed
policies:
  login:
    limits: ["5 5/m", "20 20/d"]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	c.Describe(os.Stdout)
	for _, w := range c.Warnings() {
		fmt.Println("warning:", w)
	}
	// Output:
	// config version 537e1280adf5
	// listen:   http :8080, grpc :8081, admin 127.0.0.1:9090 (metrics, health)
	// auth:     none: any client that reaches :8080 or :8081 may call the API
	// store:    postgres postgres://sluice:xxxxx@db.internal/sluice, table public.sluice_buckets, statement timeout 200ms, lock timeout 100ms (set in the sessions)
	//           concurrent takes share transactions of up to 64 takes, 2 in flight
	//           request IDs remembered 5m; on a limit change, keep the level (up to the new capacity)
	// guard:    timeout 15ms, failure mode closed: deny while the store cannot decide
	//           breaker opens after 5 failures in a row, or when 50% of at least 10 calls in 1s fail; probes the store every 500ms while open
	// policies:
	//   login  5 5/m, 20 20/d (decided together: allowed only if all allow)
	// warning: auth is not set and listen.http ":8080" and listen.grpc ":8081" accept connections from the network: any client that reaches them can spend any key's quota, and so deny others
}

func ExampleParse_problems() {
	_, err := config.Parse([]byte(`listen:
  http: 8080
policies:
  api: {limit: "100 10/x"}
  login: {limits: ["5 5/m", "5 5/m"], shadow: yes}
`))
	fmt.Println(errors.Is(err, config.ErrInvalid))
	for _, p := range config.Errors(err) {
		fmt.Println(p)
	}
	// Output:
	// true
	// line 2: listen.http: is the number 8080; want an address host:port, for example ":8080" or "127.0.0.1:9090" (a string: quote it)
	// line 4: policies.api.limit: "100 10/x" is not a limit: period "x" is not a unit (ns, us, ms, s, m, h, d), a whole number of days such as 2d, or a duration such as 1500ms; a limit is "capacity tokens/period", for example "100 10/s"
	// line 5: policies.login.shadow: is a string; want true or false
}
