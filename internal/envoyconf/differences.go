package envoyconf

// Differences returns what a user moving rules from envoyproxy/ratelimit
// to Sluice must know, in plain words: where Sluice decides otherwise, and
// the surprises of the format that both share.
func Differences() []string {
	return []string{
		"Windows and buckets: the service counts requests in fixed windows aligned to the Unix epoch (a minute rule's window starts at each whole minute, a day rule's at 00:00 UTC) and starts again from zero at each boundary; Sluice gives each rule a token bucket of capacity N that refills N tokens per unit, evenly, and starts full. Both allow N per unit over a long run, and both can allow up to 2N within one unit's span (the window: N just before a boundary and N just after it; the bucket: its N and the N refilled during the span), but a bucket has no boundary: once empty it lets one request through every unit/N, where the window lets none through until it ends and then N at once.",
		"Week, month and year are 7, 30 and 365 days in both, not calendar weeks, months or years; the service's windows of them start at multiples of their length since 1970-01-01 (a week on a Thursday), where a bucket refills evenly.",
		"Denied requests: the service counts every request in the window of each descriptor it matches, those it answers over the limit included (unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is set), shadow_mode rules too; Sluice takes nothing for a request that is over a limit, from none of its descriptors' buckets (they are decided together). Within one window that changes none of the service's decisions for the descriptor over its limit (its count is past N already), but a bucket lets a client through again as soon as a token refills, however often it was denied in between, and a request denied by one descriptor uses up nothing of the others.",
		"requests_per_unit: 0, and a rate_limit without requests_per_unit, make every request over the limit, as in the service; Sluice keeps no bucket for them. unlimited: true is answered OK without asking the store, as in the service.",
		"Buckets belong to rules: a bucket is named by its rule's domain and path (the rule's policy) and by the descriptor's entries, where the service keys a counter by the domain, the entries and the window alone. A rule whose limit changes keeps its buckets, converted as the store's on_limit_change says; a config change that sends a descriptor to another rule gives it a new, full bucket.",
		"detailed_metric and value_to_metric only change the names of the service's statistics; they are accepted and change nothing here, where the metrics are per policy.",
		"A YAML key written twice in one mapping is an error here; the service's YAML library silently keeps the last one.",
		"A domain is defined in one file: the service's MERGE_DOMAIN_CONFIG, which merges the files of one domain, is not supported.",
		"Of a directory every file is read, whatever its name, and the files of its subdirectories, as the service reads its runtime directory; hidden files and directories (their names start with a dot) are skipped, as by the service with RUNTIME_IGNOREDOTFILES=true, so that the files of a Kubernetes ConfigMap volume are read once.",
	}
}
