package scope_test

import (
	"fmt"
	"time"

	"github.com/ringfence/ringfence/policy"
	"github.com/ringfence/ringfence/scope"
)

func ExampleNew() {
	// Premium tenants get a longer deadline; everyone else the template.
	template := policy.Default()
	template.Deadline = time.Second
	tenants := scope.New(template, scope.Options[string]{
		MaxKeys: 10_000,
		Shape: func(tenant string) policy.Policy {
			p := template
			if tenant == "acme-corp" {
				p.Deadline = 10 * time.Second
			}
			return p
		},
	})
	fmt.Println(tenants.For("acme-corp").Policy().Deadline)
	fmt.Println(tenants.For("initech").Policy().Deadline)
	// Output:
	// 10s
	// 1s
}

func ExampleScope_For() {
	tenants := scope.New(policy.Default(), scope.Options[string]{})
	a := tenants.For("tenant-a")
	b := tenants.For("tenant-b")
	// Each key has its own guard; looking a key up again returns the same one.
	fmt.Println(a == tenants.For("tenant-a"), a == b)
	st := tenants.Stats()
	fmt.Println(tenants.Len(), st.Hits, st.Misses)
	// Output:
	// true false
	// 2 1 2
}
