package authz

// HasRule reports whether rules cover method.
func HasRule(rules Rules, method string) bool {
	_, ok := rules.find(method)
	return ok
}
