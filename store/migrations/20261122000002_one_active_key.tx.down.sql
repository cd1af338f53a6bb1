DROP INDEX api_keys_one_active;
