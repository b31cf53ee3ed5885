package envoyconf

// HasDomain reports whether the config defines domain.
func (c *Config) HasDomain(domain string) bool {
	if c == nil {
		return false
	}
	_, ok := c.domains[domain]
	return ok
}
