"""Hardware descriptions: fingerprints measured on the ranks (take, fingerprint), the collective latency
curves fitted to them (costmodel), and the records and datasheet presets predictions read (records)."""
