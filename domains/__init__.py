"""Reference domains the replay driver can run end to end (accounts_payable first)."""
