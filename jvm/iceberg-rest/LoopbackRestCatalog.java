// Iceberg's own REST catalog (RESTCatalogAdapter and RESTCatalogServlet, the server of Iceberg's REST
// compatibility kit and of the apache/iceberg-rest-fixture image) over a JdbcCatalog in SQLite, on
// 127.0.0.1 only, for the Iceberg sink's REST catalog tests. Run as a single-file program on the
// classpath `make jars` resolves (jvm/pom.xml, profile iceberg-rest) plus pyspark's Hadoop jars:
//
//   java -cp "$JARS/iceberg-rest/*:<hadoop-client jars>" jvm/iceberg-rest/LoopbackRestCatalog.java \
//        PORT WAREHOUSE_URI JDBC_URI
//
// PORT 0 picks a free one; the line "listening on PORT" says which. With KAFKA_EOS_REST_TOKEN set,
// every request must carry "Authorization: Bearer <that token>" (else 401): what a secured catalog
// asks of its clients.
import jakarta.servlet.DispatcherType;
import jakarta.servlet.Filter;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.FilterHolder;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class LoopbackRestCatalog {
  public static void main(String[] args) throws Exception {
    Map<String, String> properties = new HashMap<>();
    properties.put(CatalogProperties.CATALOG_IMPL, "org.apache.iceberg.jdbc.JdbcCatalog");
    properties.put(CatalogProperties.WAREHOUSE_LOCATION, args[1]);
    properties.put(CatalogProperties.URI, args[2]);
    properties.put("jdbc.schema-version", "V1");
    Catalog catalog = CatalogUtil.buildIcebergCatalog(
        "rest_backend", properties, new org.apache.hadoop.conf.Configuration());

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTCatalogAdapter(catalog))), "/*");
    String token = System.getenv("KAFKA_EOS_REST_TOKEN");
    if (token != null && !token.isEmpty()) {
      Filter bearer = (request, response, chain) -> {
        String auth = ((HttpServletRequest) request).getHeader("Authorization");
        if (("Bearer " + token).equals(auth)) {
          chain.doFilter(request, response);
        } else {
          ((HttpServletResponse) response).sendError(401, "a bearer token is required");
        }
      };
      context.addFilter(new FilterHolder(bearer), "/*", EnumSet.of(DispatcherType.REQUEST));
    }

    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost("127.0.0.1");
    connector.setPort(Integer.parseInt(args[0]));
    server.addConnector(connector);
    server.setHandler(context);
    server.start();
    System.out.println("listening on " + connector.getLocalPort());
    System.out.flush();
    server.join();
  }
}
