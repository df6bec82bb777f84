"""The pool controller: keeps each ProxyPool's members as many, where and as fresh as it asks."""
