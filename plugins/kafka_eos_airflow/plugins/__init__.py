"""The provider's Airflow plugin: :mod:`.plugin` registers :mod:`.operator_page` (the operator
page) with the API server."""
