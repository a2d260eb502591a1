/**
 * The API's answers and request fields as types (docs/openapi.json's schemas). Field names
 * are the wire's own (snake_case), so they read as the API's documentation does. Times are
 * milliseconds since the Unix epoch (`*_ms`), durations microseconds (`*_us`), sizes bytes.
 */
export {};
