package dlq_test

import (
	"fmt"

	"github.com/ringfence/ringfence/dlq"
)

func ExampleTenantToken() {
	for _, key := range []string{"acme-corp", "tenant42", "acme.corp", "acme_2ecorp", "a b/*>", ""} {
		fmt.Printf("%q -> %s\n", key, dlq.TenantToken(key))
	}
	fmt.Println(dlq.KafkaTopic("orders", "acme.corp"))
	fmt.Println(dlq.NATSSubject("dlq.orders", "acme.corp"))
	key, ok, err := dlq.ParseTenantToken("acme_2ecorp")
	fmt.Println(key, ok, err)
	// Output:
	// "acme-corp" -> acme-corp
	// "tenant42" -> tenant42
	// "acme.corp" -> acme_2ecorp
	// "acme_2ecorp" -> acme_5f2ecorp
	// "a b/*>" -> a_20b_2f_2a_3e
	// "" -> _none
	// orders.dlq.acme_2ecorp
	// dlq.orders.acme_2ecorp
	// acme.corp true <nil>
}
